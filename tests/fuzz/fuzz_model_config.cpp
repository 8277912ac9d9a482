// libFuzzer target for config.json as marlinc reads it for a model: any byte string must either parse
// (strict JSON) into a LlamaConfig whose dimensions are positive and bounded, or throw
// marlinc::Error(BadData). Any other exception (nlohmann's type errors among them), crash, leak or UB
// report is a bug.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string_view>

#include "checkpoint/error.h"
#include "checkpoint/json_strict.h"
#include "quantizer/calib/llama.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  try {
    const nlohmann::json cfg = marlinc::detail::parse_json_strict(text, "fuzz/config.json");
    const marlinc::calib::LlamaConfig c = marlinc::calib::LlamaConfig::from_json(cfg, "fuzz/config.json");
    for (int64_t d : {c.hidden, c.intermediate, c.layers, c.heads, c.kv_heads, c.head_dim, c.vocab})
      if (d <= 0 || d > (int64_t(1) << 24)) std::abort();
    if (c.heads % c.kv_heads != 0 || c.head_dim % 2 != 0) std::abort();
    if (!(c.rms_eps > 0) || !(c.rope_theta > 0)) std::abort();
    const marlinc::calib::MoeConfig& m = c.moe;  // an MoE layer's router and experts must be buildable
    if (m.experts > 0 && (m.top_k < 1 || m.top_k > m.experts || m.expert_intermediate <= 0 ||
                          static_cast<int64_t>(m.layers.size()) != c.layers))
      std::abort();
  } catch (const marlinc::Error& e) {
    if (e.kind() != marlinc::ErrorKind::BadData) std::abort();
  }
  return 0;
}
