// `verify --reference`, checkpoint-wide: every tensor of the original has its counterpart, and the
// tensors a quantizer passes through (embeddings, norms, lm_head, biases) still hold the original values.
#pragma once
#include <set>
#include <string>
#include <vector>

#include "checkpoint/checkpoint.h"

namespace marlinc {

// A pass-through tensor may differ from its original by a dtype conversion (bf16 -> fp16 rounds at
// 2^-11 relative) and no more: ‖a − b‖ / ‖b‖ at most this.
constexpr double kPassThroughMaxRelErr = 1e-2;

// Problems, one line each: a reference tensor that the checkpoint holds neither as itself nor as the
// `.weight` of one of `modules` (quantized module prefixes), one whose shape differs, a floating-point
// one with non-finite values or further from the original than kPassThroughMaxRelErr, an integer one
// whose bytes differ. lm_head.weight may be absent where config.json ties it to the embeddings.
std::vector<std::string> check_reference_tensors(const Checkpoint& ck, const Checkpoint& ref,
                                                 const std::set<std::string>& modules);

}  // namespace marlinc
