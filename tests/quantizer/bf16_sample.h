// The built-in sample model as a bf16 checkpoint (every floating-point tensor bf16, config.json saying so),
// for the bf16 model paths: the quantizer's bf16 grid, the outputs' bf16 scales.
#pragma once
#include <filesystem>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "checkpoint/checkpoint.h"
#include "checkpoint/convert_dtype.h"
#include "checkpoint/writer.h"

namespace marlinc::test {

inline void write_bf16_sample(const std::filesystem::path& dir) {
  const std::filesystem::path model = std::filesystem::path(MARLINC_SOURCE_DIR) / "data" / "sample" / "model";
  const Checkpoint src = Checkpoint::open(model);
  std::vector<TensorSpec> plan;
  for (const auto& name : src.tensor_names()) plan.push_back({name, DType::BF16, src.at(name).info->shape});
  CheckpointWriter w(dir, plan);
  for (const auto& name : src.tensor_names()) {
    const auto r = src.at(name);
    const std::vector<float> f = to_float(r.file->data(*r.info), r.info->dtype);
    w.write(name, from_float(f, DType::BF16));
  }
  nlohmann::json cfg = src.config();
  cfg["dtype"] = "bfloat16";
  w.add_file("config.json", cfg.dump(2) + "\n");
  w.commit();
}

}  // namespace marlinc::test
