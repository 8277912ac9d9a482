#include "checkpoint/checkpoint.h"

#include <algorithm>
#include <cctype>
#include <cstdio>
#include <fstream>
#include <regex>
#include <set>
#include <sstream>

#include "checkpoint/json_strict.h"

namespace marlinc {

namespace fs = std::filesystem;
using json = nlohmann::json;

namespace {

// Two config values for one key mean the same: equal, or strings equal but for case (AutoAWQ writes
// "version": "GEMM" in quant_config.json and transformers "gemm" in config.json).
bool same_setting(const json& a, const json& b) {
  if (a.is_string() && b.is_string()) {
    const std::string x = a.get<std::string>(), y = b.get<std::string>();
    auto lower = [](char c) { return std::tolower(static_cast<unsigned char>(c)); };
    return std::equal(x.begin(), x.end(), y.begin(), y.end(), [&](char c, char d) { return lower(c) == lower(d); });
  }
  return a == b;
}

std::string read_text(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  if (!in) fail(ErrorKind::Io, p.string() + ": cannot open for reading");
  std::ostringstream ss;
  ss << in.rdbuf();
  if (in.bad()) fail(ErrorKind::Io, p.string() + ": read failed");
  return ss.str();
}

// config-like files must be JSON objects; anything else is corrupt.
json read_json_object(const fs::path& p) {
  json j = detail::parse_json_strict(read_text(p), p.string());
  if (!j.is_object()) bad_data(p.string() + ": top level is " + std::string(j.type_name()) + ", expected a JSON object");
  return j;
}

// A shard named by the index must be a plain file name in the checkpoint directory.
bool plain_file_name(const std::string& s) {
  return !s.empty() && s != "." && s != ".." && s.find('/') == std::string::npos && s.find('\0') == std::string::npos;
}

}  // namespace

Checkpoint Checkpoint::open(const fs::path& file_or_dir) {
  Checkpoint ck;
  std::error_code ec;
  const fs::file_status st = fs::status(file_or_dir, ec);
  if (ec || !fs::exists(st)) bad_usage(file_or_dir.string() + ": no such file or directory");
  ck.source_ = file_or_dir;
  std::vector<fs::path> shard_paths;
  fs::path index_path;
  if (fs::is_directory(st)) {
    ck.dir_ = file_or_dir;
    index_path = file_or_dir / "model.safetensors.index.json";
    if (fs::exists(index_path)) {
      ck.sharded_ = true;
    } else {
      index_path.clear();
      if (fs::exists(file_or_dir / "model.safetensors")) {
        shard_paths.push_back(file_or_dir / "model.safetensors");
      } else {
        std::vector<fs::path> found;
        for (const auto& e : fs::directory_iterator(file_or_dir))
          if (e.is_regular_file() && e.path().extension() == ".safetensors") found.push_back(e.path());
        std::sort(found.begin(), found.end());
        if (found.empty())
          bad_data(file_or_dir.string() + ": no model.safetensors, no model.safetensors.index.json and no *.safetensors file");
        if (found.size() > 1)
          bad_data(file_or_dir.string() + ": " + std::to_string(found.size()) +
                   " *.safetensors files but no model.safetensors.index.json saying which belong to the model");
        shard_paths.push_back(found[0]);
      }
    }
  } else {
    ck.dir_ = file_or_dir.has_parent_path() ? file_or_dir.parent_path() : fs::path(".");
    shard_paths.push_back(file_or_dir);
  }

  if (ck.sharded_) {
    const std::string label = index_path.string();
    json idx = read_json_object(index_path);
    auto wm = idx.find("weight_map");
    if (wm == idx.end() || !wm->is_object()) bad_data(label + ": weight_map: missing or not a JSON object");
    std::map<std::string, std::string> weight_map;  // tensor -> shard file
    std::set<std::string> shard_names;
    for (auto it = wm->begin(); it != wm->end(); ++it) {
      if (!it->is_string()) bad_data(label + ": " + it.key() + ": weight_map value is not a shard file name");
      const std::string& s = it->get_ref<const std::string&>();
      if (!plain_file_name(s)) bad_data(label + ": " + it.key() + ": shard \"" + s + "\" is not a plain file name");
      weight_map.emplace(it.key(), s);
      shard_names.insert(s);
    }
    for (const auto& [tensor, shard] : weight_map)
      if (!fs::is_regular_file(ck.dir_ / shard))
        bad_data(label + ": " + tensor + ": shard " + shard + " does not exist");
    // Numbered shards (<base>-00002-of-00005.safetensors) imply their siblings: one the index does not
    // mention still gets opened, so tensors it holds are reported as missing from the index.
    for (const std::string& s : std::set<std::string>(shard_names)) {
      std::smatch m;
      static const std::regex kNumbered(R"((.*)-(\d{5})-of-(\d{5})\.safetensors)");
      if (!std::regex_match(s, m, kNumbered)) continue;
      const int total = std::stoi(m[3].str());
      for (int i = 1; i <= total; ++i) {
        char buf[48];  // total has 5 digits (the regex); room for any int keeps -Wformat-truncation quiet
        std::snprintf(buf, sizeof buf, "-%05d-of-%05d.safetensors", i, total);
        const std::string sib = m[1].str() + buf;
        if (shard_names.count(sib)) continue;
        if (!fs::is_regular_file(ck.dir_ / sib))
          bad_data(label + ": shard " + sib + " (" + std::to_string(i) + " of " + std::to_string(total) +
                   ") does not exist and the index maps no tensor to it");
        shard_names.insert(sib);
      }
    }
    std::map<std::string, size_t> file_index;
    for (const std::string& s : shard_names) {
      file_index[s] = ck.files_.size();
      ck.files_.push_back(SafetensorsFile::open(ck.dir_ / s));
    }
    for (const auto& [tensor, shard] : weight_map) {
      const SafetensorsFile& f = ck.files_[file_index[shard]];
      const TensorInfo* t = f.find(tensor);
      if (!t) bad_data(label + ": " + tensor + ": index maps it to " + shard + " but that shard has no such tensor");
      ck.index_.emplace(tensor, Ref{&f, t});
    }
    for (const SafetensorsFile& f : ck.files_)
      for (const TensorInfo& t : f.tensors()) {
        auto it = weight_map.find(t.name);
        if (it == weight_map.end())
          bad_data(f.path().string() + ": " + t.name + ": tensor is missing from " + index_path.filename().string());
        if (it->second != f.path().filename().string())
          bad_data(f.path().string() + ": " + t.name + ": tensor also stored here but the index maps it to " +
                   it->second + " (every tensor must be in exactly one shard)");
      }
  } else {
    ck.files_.push_back(SafetensorsFile::open(shard_paths[0]));
    for (const TensorInfo& t : ck.files_[0].tensors()) ck.index_.emplace(t.name, Ref{&ck.files_[0], &t});
  }
  ck.names_.reserve(ck.index_.size());
  for (const auto& [name, ref] : ck.index_) ck.names_.push_back(name);

  // A config file that exists but is not a file (a directory, a dangling link) is an error, not a missing config.
  for (const char* name : {"config.json", "quant_config.json", "quantize_config.json"}) {
    std::error_code ec;
    const fs::path p = ck.dir_ / name;
    if (fs::symlink_status(p, ec).type() != fs::file_type::not_found && !fs::is_regular_file(p, ec))
      bad_data(p.string() + ": not a regular file (a directory or a broken link)");
  }
  if (fs::is_regular_file(ck.dir_ / "config.json")) ck.config_ = read_json_object(ck.dir_ / "config.json");
  // §4.6 search order: quantize_config.json, quant_config.json, config.json["quantization_config"].
  // Merge lowest priority first so the earlier file's keys win.
  if (auto qc = ck.config_.find("quantization_config"); qc != ck.config_.end() && !qc->is_null()) {
    if (!qc->is_object()) bad_data((ck.dir_ / "config.json").string() + ": quantization_config: not a JSON object");
    ck.quant_config_.update(*qc);
    ck.quant_sources_.insert(ck.quant_sources_.begin(), "config.json:quantization_config");
  }
  for (const char* name : {"quant_config.json", "quantize_config.json"}) {
    if (fs::is_regular_file(ck.dir_ / name)) {
      const json file = read_json_object(ck.dir_ / name);
      // transformers and vLLM read config.json first, the GPTQ tools quantize_config.json: where the two
      // give a key different values, one of them loads the weights wrongly.
      for (const char* key : {"bits", "group_size", "sym", "desc_act", "checkpoint_format", "quant_method",
                              "zero_point", "w_bit", "q_group_size", "version", "is_marlin_format"})
        if (file.contains(key) && ck.quant_config_.contains(key) && !same_setting(file.at(key), ck.quant_config_.at(key)))
          ck.quant_conflicts_.push_back(std::string(name) + " says " + key + " = " + file.at(key).dump() + " but " +
                                        ck.quant_sources_.front() + " says " + ck.quant_config_.at(key).dump());
      ck.quant_config_.update(file);
      ck.quant_sources_.insert(ck.quant_sources_.begin(), name);
    }
  }
  return ck;
}

std::optional<Checkpoint::Ref> Checkpoint::find(std::string_view name) const {
  auto it = index_.find(name);
  if (it == index_.end()) return std::nullopt;
  return it->second;
}

Checkpoint::Ref Checkpoint::at(std::string_view name) const {
  auto r = find(name);
  if (!r) bad_data(source_.string() + ": " + std::string(name) + ": no such tensor in the checkpoint");
  return *r;
}

}  // namespace marlinc
