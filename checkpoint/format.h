// Detecting which quantized format a checkpoint holds (spec: formats.md §1.10, §3.7, §4, §5, §6), from
// tensor names AND config, and the Marlin kernel shape rules (§1.9, §3.6). Detection is reported with
// notes, never guessed silently: a disagreement between the config label and the data is a note.
#pragma once
#include <cstdint>
#include <set>
#include <string>
#include <vector>

#include "checkpoint/checkpoint.h"

namespace marlinc {

enum class Format {
  Plain,                      // no quantized tensors (fp16/bf16/fp32 weights)
  GptqV1,                     // qweight/qzeros/scales(/g_idx), zeros stored as z-1
  GptqV2,                     // same tensors, zeros stored as z
  Marlin,                     // <p>.B [k/16, 2n] + <p>.s
  Marlin24,                   // <p>.B_24 + <p>.B_meta|meta + <p>.s|s_24
  Awq,                        // AWQ GEMM: qweight [k, n/8], qzeros, scales
  CompressedTensorsPack,      // weight_packed [n, k/8] + weight_scale (+ weight_shape)
  CompressedTensorsMarlin24,  // weight_packed [k/32, 2n] + meta + scale_packed
  Unknown,                    // quantized-looking tensors that fit no format
};

// A tensor name split at its last '.': the module prefix ("" for a bare file's "B", "s") and the leaf.
struct TensorName {
  std::string prefix, leaf;
};
TensorName split_tensor_name(const std::string& name);
// prefix + "." + leaf, or just leaf for the bare-file prefix "".
std::string join_tensor_name(const std::string& prefix, const std::string& leaf);
// The tensor a Marlin-24 checkpoint holds for the Marlin-24 name `name`: the original Sparse-Marlin packer
// names B_meta `meta` and s `s_24` (the same bytes). `name` itself where the checkpoint has it or where it
// has no alias.
std::string marlin24_stored_name(const Checkpoint& ck, const std::string& name);

struct FormatInfo {
  Format format = Format::Unknown;
  int bits = 0;          // 0 for Plain
  int group_size = 0;    // -1 = per-channel; 0 when unknown/Plain
  bool sym = true;
  bool desc_act = false;
  // Bit widths and group sizes the config assigns to some modules besides the values above (GPTQModel
  // `dynamic` "+:" overrides, further compressed-tensors config_groups).
  std::set<int> other_bits, other_groups;
  std::string label_in_config;     // e.g. "gptq/gptq_v2" (quant_method/checkpoint_format), "" if none
  std::vector<std::string> notes;  // e.g. "config says gptq but qzeros hold v2 values (8)"
};

FormatInfo detect_format(const Checkpoint& ck);

// The bit width of a compressed-tensors pack-quantized module from its true k (weight_shape) and the
// columns of its weight_packed ([n, ceil(k / (32/bits))]): `preferred` (the config's) when that fits,
// else the width among 2, 4, 8 that does, else `preferred` (the caller reports the mismatch).
int ct_module_bits(int64_t k, int64_t packed_cols, int preferred);
std::string format_name(Format f);  // "plain", "gptq-v1", "gptq-v2", "marlin", "marlin24", "awq", ...

// Prefixes of the quantized modules (e.g. "model.layers.0.self_attn.q_proj"; "" for a bare file whose
// tensors are named "B", "s"), sorted.
std::vector<std::string> quantized_modules(const Checkpoint& ck, Format f);

// One quantized linear's logical shape, derived from its packed tensors.
struct QuantizedModuleShape {
  std::string prefix;
  int64_t k = 0, n = 0;  // input / output features
  int bits = 0;
  int group_size = 0;    // -1 = per-channel; derived from the scale rows when the config is silent
  uint64_t stored_bytes = 0;  // all tensors of the module (packed weight, scales, zeros, g_idx, meta)
  std::vector<std::string> tensors;  // those tensors' names (a bias stays a plain tensor)
};
// Throws BadData naming the tensor when a module's tensors have inconsistent shapes; with `malformed`,
// such a module is left out and its prefix and error recorded there instead (so one broken module
// does not hide the others: verify fails it as a layer).
std::vector<QuantizedModuleShape> quantized_module_shapes(
    const Checkpoint& ck, const FormatInfo& fi, std::vector<std::pair<std::string, std::string>>* malformed = nullptr);

struct MarlinRuleCheck {
  bool ok = true;
  std::string rule;  // the first rule that fails; when ok, notes such as the batch-size caveat
};
// Marlin kernel rules (§1.9 dense, §3.6 2:4): bits 4/8; k % 128; dense n % 64 (vLLM gptq_marlin) with
// n % 256 needed by the IST kernel for batch > 16 (reported in `rule` when only n % 64 holds);
// 2:4 n % 256; group -1/32/64/128 dense (IST: -1/128), -1/128 for 2:4; group must divide k.
MarlinRuleCheck marlin_compatible(int64_t k, int64_t n, int group_size, int bits, bool sparse24);

}  // namespace marlinc
