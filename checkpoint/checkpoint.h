// A Hugging Face checkpoint on disk: one safetensors file, a directory with model.safetensors (or any
// single *.safetensors), or shards listed by model.safetensors.index.json (spec: formats.md §7.3), plus
// config.json and the quantization config (§4.6). Everything is validated on open; tensor bytes stay in
// the mapped files.
#pragma once
#include <filesystem>
#include <map>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "checkpoint/safetensors.h"

namespace marlinc {

class Checkpoint {
 public:
  // file_or_dir: a *.safetensors file (config files are then looked up beside it), or a directory
  // holding model.safetensors.index.json (sharded; validated: every tensor in exactly one shard that
  // exists, index entries name tensors present in that shard, every shard tensor listed), else
  // model.safetensors, else exactly one *.safetensors file. Throws BadData / Io naming the file.
  static Checkpoint open(const std::filesystem::path& file_or_dir);

  Checkpoint(Checkpoint&&) noexcept = default;
  Checkpoint& operator=(Checkpoint&&) noexcept = default;

  struct Ref {
    const SafetensorsFile* file;
    const TensorInfo* info;
  };
  const std::vector<std::string>& tensor_names() const { return names_; }  // sorted
  std::optional<Ref> find(std::string_view name) const;
  Ref at(std::string_view name) const;  // throws BadData naming the tensor when absent
  std::span<const uint8_t> data(std::string_view name) const { Ref r = at(name); return r.file->data(*r.info); }
  bool contains(std::string_view name) const { return find(name).has_value(); }

  const nlohmann::json& config() const { return config_; }  // config.json, or an empty object
  // Quantization config merged in the §4.6 search order: config.json["quantization_config"], overlaid
  // by quant_config.json, overlaid by quantize_config.json (earlier in the search order wins). Empty
  // object when none exists.
  const nlohmann::json& quantize_config() const { return quant_config_; }
  // Which files quantize_config() came from, highest priority first (e.g. "quantize_config.json").
  const std::vector<std::string>& quantize_config_sources() const { return quant_sources_; }
  // Keys those files give different values, one line each (e.g. "quantize_config.json says bits = 4
  // but config.json:quantization_config says 8"); detect_format turns them into notes.
  const std::vector<std::string>& quantize_config_conflicts() const { return quant_conflicts_; }

  const std::filesystem::path& dir() const { return dir_; }
  const std::vector<SafetensorsFile>& files() const { return files_; }
  bool sharded() const { return sharded_; }
  // A label for messages: the single file, or the directory.
  const std::filesystem::path& source() const { return source_; }

 private:
  Checkpoint() = default;
  std::filesystem::path dir_, source_;
  std::vector<SafetensorsFile> files_;
  std::vector<std::string> names_;
  std::map<std::string, Ref, std::less<>> index_;
  nlohmann::json config_ = nlohmann::json::object();
  nlohmann::json quant_config_ = nlohmann::json::object();
  std::vector<std::string> quant_conflicts_;
  std::vector<std::string> quant_sources_;
  bool sharded_ = false;
};

}  // namespace marlinc
