// The block linears of a quantized checkpoint (GPTQ, Marlin, Marlin-24, AWQ, compressed-tensors) for
// the forward pass: read through the packer's adapters and dequantized to fp32 [out, in], so
// `marlinc ppl` measures a quantized model with the same forward pass as the original.
#pragma once
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "checkpoint/checkpoint.h"
#include "checkpoint/format.h"
#include "packer/adapters.h"
#include "quantizer/calib/llama.h"

namespace marlinc::calib {

class QuantizedLinears : public LinearProvider {
 public:
  // Throws BadUsage when ck holds no quantized layer. ck must outlive this object; c (the model's
  // config) says where each block linear is stored (linear_source: Phi-3's fused modules).
  QuantizedLinears(const Checkpoint& ck, const LlamaConfig& c);
  // The dequantized weight of a quantized module; nullopt (the plain weight) for one that is not.
  std::optional<Matrix> weight(int64_t block, LinearRef r) const override;
  // The quantized module itself, or a fused module's rows of it (the GPU pass runs it through the Marlin
  // kernel); nullopt for a linear that is not quantized.
  std::optional<QuantizedLinear> quantized(int64_t block, LinearRef r) const;
  const FormatInfo& format() const { return fi_; }
  size_t modules() const { return mods_.size(); }

 private:
  const Checkpoint& ck_;
  LlamaConfig cfg_;
  FormatInfo fi_;
  std::vector<ModuleDesc> mods_;
  std::map<std::string, size_t> by_prefix_;
  // The last fused module read: its parts are asked for one after another.
  mutable std::mutex cache_mu_;
  mutable std::string cached_prefix_;
  mutable std::shared_ptr<const QuantizedLinear> cached_;
};

}  // namespace marlinc::calib
