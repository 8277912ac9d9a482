// Format adapters: map one quantized module's tensors (and the checkpoint's config keys) to and from
// the neutral QuantizedLinear (spec: ../shared/spec/formats.md §1.10, §2, §3.7, §4, §5, §6). A
// conversion is read(format A) then write(format B); no format talks to another directly.
//
// Tensor names per format (<p> = module prefix):
//   gptq / gptq_v2     <p>.qweight [k/pf, n] I32, <p>.qzeros [G, n/pf] I32 (v1: z-1, v2: z),
//                      <p>.scales [G, n] F16|BF16, <p>.g_idx [k] I32
//   marlin             <p>.B [k/16, 2n|4n] I32, <p>.s [G, n] permuted; marlinc extensions (docs/FORMATS.md):
//                      <p>.qzeros [G, n/8] I32 in the Marlin zero-point layout (asymmetric 4-bit),
//                      <p>.g_idx [k] I32 sorted + <p>.perm [k] I32 (act-order: Marlin row j = original row perm[j])
//   marlin24           <p>.B_24 [k/32, 2n|4n] I32, <p>.B_meta [k/32, 2n] I16, <p>.s [G, n] (2:4 permuted)
//   awq (GEMM)         <p>.qweight [k, n/8] I32, <p>.qzeros [G, n/8] I32, <p>.scales [G, n]   (order map)
//   compressed-tensors <p>.weight_packed [n, ceil(k/pf)] I32, <p>.weight_scale [n, G], <p>.weight_shape [2] I64,
//                      <p>.weight_zero_point [ceil(n/pf), G] I32 (asym), <p>.weight_g_idx [k] I32 (act-order)
//   ct marlin-24 (read) <p>.weight_packed [k/32, 2n], <p>.meta [k/32, 2n] I16, <p>.scale_packed [G, n]
// <p>.bias is never part of a module: it passes through unchanged like every other tensor.
#pragma once
#include <cstdint>
#include <functional>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "checkpoint/checkpoint.h"
#include "checkpoint/format.h"
#include "checkpoint/tensor_parallel.h"
#include "checkpoint/writer.h"
#include "packer/quantized_linear.h"

namespace marlinc {

// What `marlinc convert --to` can write.
enum class TargetFormat { Marlin, Marlin24, GptqV1, GptqV2, CompressedTensors, Awq };
// "marlin", "marlin24", "gptq", "gptq_v2", "compressed-tensors", "awq" (also accepts "gptq_v1",
// "marlin_24", "compressed_tensors", "ct"); nullopt otherwise.
std::optional<TargetFormat> target_from_name(std::string_view name);
std::string target_name(TargetFormat t);
// The detected-format value a checkpoint written in `t` is recognised as.
Format target_format(TargetFormat t);

// A module as stored in the source, described from its small tensors only (shapes, zeros, g_idx):
// enough to check the target's rules and plan output tensors before any weight is unpacked.
struct ModuleDesc {
  std::string prefix;
  Format format = Format::Unknown;  // the module's own format (GPTQ: v1/v2 as the data says)
  int64_t k = 0, n = 0;
  int bits = 4;
  int group_size = -1;    // -1 = one group over k
  int64_t groups = 1;     // rows of the scale matrix
  bool sym = true;        // every real zero point is 2^(bits-1)
  bool act_order = false; // non-trivial g_idx (or a stored Marlin row permutation)
  bool sparse24 = false;
  ScaleType scale_type = ScaleType::F16;
  int min_zero = -1;      // smallest real zero point when asymmetric (-1 when symmetric)
  std::vector<std::string> tensors;  // source tensors that make up the module (bias excluded)
  uint64_t stored_bytes = 0;         // sum of those tensors' bytes
  std::vector<std::string> notes;    // e.g. "labelled gptq (v1) but qzeros hold v2 values (8)"
};

ModuleDesc describe_module(const Checkpoint& ck, const std::string& prefix, const FormatInfo& fi);
// Every quantized module of the checkpoint, sorted by prefix.
std::vector<ModuleDesc> describe_modules(const Checkpoint& ck, const FormatInfo& fi);

// ---- readers: module tensors -> QuantizedLinear (validated). Throw BadData naming the tensor and rule.
QuantizedLinear read_gptq(const Checkpoint& ck, const std::string& prefix, const FormatInfo& fi);
QuantizedLinear read_marlin(const Checkpoint& ck, const std::string& prefix, const FormatInfo& fi);
QuantizedLinear read_marlin24(const Checkpoint& ck, const std::string& prefix, const FormatInfo& fi);
QuantizedLinear read_awq(const Checkpoint& ck, const std::string& prefix, const FormatInfo& fi);
QuantizedLinear read_compressed_tensors(const Checkpoint& ck, const std::string& prefix, const FormatInfo& fi);
QuantizedLinear read_ct_marlin24(const Checkpoint& ck, const std::string& prefix, const FormatInfo& fi);
// Throws BadData naming the tensor where a quantized module has what it may not have beside its own tensors: a
// bias other than one float per output column ([n], f16/bf16/f32), or a plain `<p>.weight` (two forms of one layer
// leave a loader to guess which it runs). describe_modules applies it to every module.
void check_module_neighbours(const Checkpoint& ck, const ModuleDesc& d);
// Dispatch on the module's format (desc.format).
QuantizedLinear read_module(const Checkpoint& ck, const ModuleDesc& desc, const FormatInfo& fi);

// ---- writers: QuantizedLinear -> tensors of one module.
struct PackedTensor {
  TensorSpec spec;
  std::vector<uint8_t> bytes;  // little-endian, row-major, exactly shape x dtype size
};

// Why `t` cannot hold the module ("" when it can), naming the rule, e.g. "k % 128 == 0 (k = 4000)".
std::string target_rule(TargetFormat t, const ModuleDesc& d);
// target_rule on one tensor-parallel rank's part of the module (checkpoint/tensor_parallel.h) at size
// tp > 1, grouped layers keeping whole groups per rank; "" when it holds or tp <= 1, else the rule
// prefixed with "tensor parallel <tp>: ".
std::string target_rule_tp(TargetFormat t, const ModuleDesc& d, int tp, const TpHeads& heads);
// Checkpoint-wide choices that every module of an output follows. Loaders size each module from the
// config: when it says asymmetric (or act-order), vLLM and compressed-tensors expect zero points (or
// g_idx) in every module, also in one whose zero points are all 2^(bits-1) (or whose g_idx is trivial).
// GPTQ and AWQ always store both; Marlin and compressed-tensors only where a module needs them unless
// these are set.
struct ModuleLayout {
  bool zero_points = false;  // every module stores zero points (Marlin: 4-bit modules)
  bool g_idx = false;        // every module stores g_idx (Marlin: with its row permutation)
  // Sparse-Marlin: record q.mask's positions (verify re-packs what a file recorded) instead of the §3.2 rule
  // on the values, which is what the reference packers write.
  bool recorded_24_positions = false;
};
// The tensors write_module will produce for a module described by `d` (same names, dtypes, shapes).
std::vector<TensorSpec> plan_module(TargetFormat t, const ModuleDesc& d, ModuleLayout layout = {});
std::vector<PackedTensor> write_module(TargetFormat t, const QuantizedLinear& q, ModuleLayout layout = {});

std::vector<PackedTensor> write_gptq(const QuantizedLinear& q, bool v2);
// force_g_idx: store g_idx/perm even when trivial (ModuleLayout::g_idx).
std::vector<PackedTensor> write_marlin(const QuantizedLinear& q, bool force_g_idx = false);
// Needs q.mask, or codes that are already 2:4 (at most 2 non-zero codes per aligned 4 rows). Which 2 of
// every 4 positions are recorded follows the §3.2 rule on the values (pruned ones zero), as the reference
// packers do: where a kept weight rounds to zero, that can differ from q.mask, with the same values.
// recorded_positions: keep q.mask's positions instead.
std::vector<PackedTensor> write_marlin24(const QuantizedLinear& q, bool recorded_positions = false);
std::vector<PackedTensor> write_awq(const QuantizedLinear& q);
std::vector<PackedTensor> write_compressed_tensors(const QuantizedLinear& q, bool force_g_idx = false);

// The mask a symmetric layer's codes imply for Sparse-Marlin: the §3.2 selection rule applied to the
// signed values (code - 2^(bits-1)). Throws BadData naming the module, row and column when an aligned
// group of 4 rows holds more than 2 non-zero weights (the layer is not 2:4).
std::vector<uint8_t> mask_24_from_codes(const QuantizedLinear& q);

// A layer kept unconverted (--keep-incompatible): `<p>.weight` [n, k] in the scale dtype, each value
// (q - z) * s computed exactly in fp32 and rounded once to nearest-even.
TensorSpec dequantized_spec(const ModuleDesc& d);
PackedTensor write_dequantized(const QuantizedLinear& q);

// ---- checkpoint-wide configuration of the target.
// Said (convert's notes, quantize's output) wherever a Marlin output carries act-order in marlinc's extension.
inline constexpr const char* kMarlinActOrderNote =
    "act-order modules are written in marlinc's Marlin extension (sorted g_idx + perm, docs/FORMATS.md): loaders "
    "that ignore perm compute wrong outputs; convert to gptq or compressed-tensors for those";
struct QuantSummary {
  int bits = 4;
  int group_size = 128;
  bool sym = true;
  bool desc_act = false;
  // Calibrated in activation order with contiguous groups (no g_idx): compressed-tensors actorder "weight"
  // for grouped schemes (vLLM refuses an actorder on per-channel ones).
  bool weight_act_order = false;
  std::vector<std::string> dequantized;  // module prefixes kept as plain weights
  // Prefixes of other plain rank-2 `.weight` tensors (lm_head, embeddings...): compressed-tensors lists
  // them in `ignore` because its scheme targets every Linear.
  std::vector<std::string> plain_linears;
  bool lm_head_quantized = false;  // GPTQ-family configs say `lm_head: true` (vLLM builds it quantized then)
  bool act_order_marlin = false;  // the marlin output carries <p>.g_idx/<p>.perm (marlinc extension)
  bool zero_points_marlin = false;  // the marlin output carries <p>.qzeros (marlinc extension)
  // Modules whose bits/group size differ from the values above: prefix -> (bits, group_size).
  std::vector<std::pair<std::string, std::pair<int, int>>> overrides;
};
// Whether a module prefix names token embeddings (`embed_tokens`, GPT-2's `wte`): nn.Embedding, not a
// linear layer, so never quantized and never listed among a config's unquantized linears.
inline bool is_embedding(const std::string& prefix) {
  return prefix.find("embed") != std::string::npos || prefix.find("wte") != std::string::npos;
}

// Mixture-of-experts routers: linears named `router`, `router.layer` or `shared_expert_gate`, and `gate`
// (or Hunyuan's `gate.wg`) in a block P that holds experts (`<P>.experts.*`): Mixtral, Qwen2/3-MoE,
// DeepSeek, OLMoE, Jamba, Llama 4, gpt-oss, Granite-MoE, DBRX. Every quantizing tool and loader keeps them
// in 16 bits (vLLM builds them with no quant config, so a quantized one would not load), and their n (the
// number of experts) is often a multiple of 64 that would otherwise pass the Marlin rules.
// `expert_parents` is moe_expert_parents(tensor names).
std::set<std::string> moe_expert_parents(const std::vector<std::string>& tensor_names);
bool is_moe_router(const std::string& prefix, const std::set<std::string>& expert_parents);

// The linear layers an output of `ck` leaves unquantized, for QuantSummary::plain_linears: every 2-D
// `<p>.weight` whose prefix `quantized` rejects, except embeddings (nn.Embedding, not linear), plus
// `lm_head` when a causal LM has no lm_head tensor (tied to the embeddings: loaders still build an
// lm_head Linear, which a compressed-tensors "Linear" target would otherwise claim). Sorted.
std::vector<std::string> unquantized_linears(const Checkpoint& ck, const std::function<bool(const std::string&)>& quantized);

// Whether a tensor name ends in a leaf (after its last '.') that the quantized formats store. The
// distinctive leaves (qweight, B_24, weight_packed, ...) appear in no plain model, so convert refuses one
// outside every module; with `short_names` also B, s, scales, meta and perm, which some plain models use
// too and which verify only reports as leftovers.
bool is_quant_leaf(const std::string& tensor_name, bool short_names);

struct TargetConfig {
  nlohmann::json config;                          // config.json (source keys kept, quantization_config replaced)
  std::optional<nlohmann::json> quantize_config;  // quantize_config.json when the target family uses one
};
// `src_config` is the source config.json ({} when absent) and `src_quant` the source quantization config
// (Checkpoint::quantize_config()); generic keys such as damp_percent/true_sequential survive between
// GPTQ-family formats.
TargetConfig target_config(TargetFormat t, const nlohmann::json& src_config, const nlohmann::json& src_quant,
                           const QuantSummary& s);

}  // namespace marlinc
