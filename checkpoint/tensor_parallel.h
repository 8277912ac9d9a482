// The part of a linear layer one tensor-parallel rank holds when a serving engine splits the model
// across GPUs (vLLM's ColumnParallelLinear / RowParallelLinear / QKVParallelLinear). The Marlin rules
// (k % 128, n % 64, whole groups) apply to that part, not to the whole layer: a checkpoint whose layers
// all pass can still fail to load at tensor parallel 4 (gptq.md §6 item 7: Qwen2-72B's down_proj, k =
// 29568, leaves 7392 per rank, not a multiple of 128). Shapes only; the rules live with the formats.
#pragma once
#include <cstdint>
#include <string>

#include <nlohmann/json.hpp>

namespace marlinc {

enum class TpSplit {
  Column,  // the output features n are split (q/k/v, gate/up, lm_head, everything not listed as Row)
  Row,     // the input features k are split (attention output and MLP down projections)
};
// By the module name's last component: o_proj, down_proj, out_proj, dense_4h_to_h, fc2, w2, wo and
// c_proj are row-parallel in vLLM's model definitions; every other linear layer is column-parallel.
TpSplit tp_split(const std::string& module);
const char* tp_split_name(TpSplit s);  // "column" / "row"

// Key-value heads of the model (config.json, or its text_config): vLLM replicates k/v heads when the
// tensor-parallel size exceeds their number, so a rank then holds one whole head. 0 = unknown.
struct TpHeads {
  int64_t kv_heads = 0, head_dim = 0;
};
TpHeads tp_heads(const nlohmann::json& config);

struct TpShard {
  int64_t k = 0, n = 0;  // one rank's part [k, n]
  TpSplit split = TpSplit::Column;
  bool replicated = false;  // k/v heads replicated across ranks (one head per rank)
  std::string error;        // non-empty: the layer does not split into tp equal parts (the rule, with numbers)
};
// One rank's part of `module` [k, n] at tensor-parallel size tp >= 1 (tp = 1: the whole layer).
TpShard tp_shard(const std::string& module, int64_t k, int64_t n, int tp, const TpHeads& heads);

}  // namespace marlinc
