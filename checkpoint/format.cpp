#include "checkpoint/format.h"

#include <algorithm>
#include <cstring>
#include <limits>
#include <map>
#include <optional>
#include <regex>
#include <set>

namespace marlinc {

using json = nlohmann::json;

namespace {

// Which packed-tensor family a module prefix belongs to, from its leaf names alone.
enum class Kind { QWeight /* GPTQ or AWQ */, Marlin, Marlin24, CtPack, CtMarlin24 };

std::string join(const std::string& prefix, const char* leaf) { return join_tensor_name(prefix, leaf); }

std::map<std::string, std::set<std::string>> leaves_by_prefix(const Checkpoint& ck) {
  std::map<std::string, std::set<std::string>> m;
  for (const std::string& n : ck.tensor_names()) {
    const TensorName s = split_tensor_name(n);
    m[s.prefix].insert(s.leaf);
  }
  return m;
}

std::map<std::string, Kind> module_kinds(const Checkpoint& ck) {
  std::map<std::string, Kind> out;
  for (const auto& entry : leaves_by_prefix(ck)) {
    const std::string& prefix = entry.first;
    const auto& leaves = entry.second;  // a named reference: clang 14 cannot capture a structured binding
    auto has = [&](const char* l) { return leaves.count(l) > 0; };
    if (has("B_24") && (has("B_meta") || has("meta"))) out[prefix] = Kind::Marlin24;
    else if (has("weight_packed") && has("meta") && has("scale_packed")) out[prefix] = Kind::CtMarlin24;
    else if (has("weight_packed") && has("weight_scale")) out[prefix] = Kind::CtPack;
    else if (has("qweight") && has("scales")) out[prefix] = Kind::QWeight;
    else if (has("B") && has("s")) out[prefix] = Kind::Marlin;
  }
  return out;
}

const json* get(const json& j, const char* key) {
  auto it = j.find(key);
  return it == j.end() || it->is_null() ? nullptr : &*it;
}
std::string lower(std::string s) {
  for (char& c : s) c = char(std::tolower(static_cast<unsigned char>(c)));
  return s;
}
std::string get_str(const json& j, const char* key) {
  const json* v = get(j, key);
  return v && v->is_string() ? lower(v->get<std::string>()) : "";
}
// An integer key outside int's range reads as absent (detect_format notes it: note_bad_values).
std::optional<int> get_int(const json& j, const char* key) {
  const json* v = get(j, key);
  if (!v || !v->is_number_integer()) return std::nullopt;
  if (v->is_number_unsigned() && v->get<uint64_t>() > uint64_t(std::numeric_limits<int>::max())) return std::nullopt;
  const int64_t x = v->is_number_unsigned() ? int64_t(v->get<uint64_t>()) : v->get<int64_t>();
  if (x < std::numeric_limits<int>::min() || x > std::numeric_limits<int>::max()) return std::nullopt;
  return int(x);
}
std::optional<bool> get_bool(const json& j, const char* key) {
  const json* v = get(j, key);
  if (v && v->is_boolean()) return v->get<bool>();
  return std::nullopt;
}

// The "weights" block of the first compressed-tensors config group, or null.
const json* ct_weights(const json& qc) {
  const json* groups = get(qc, "config_groups");
  if (!groups || !groups->is_object()) return nullptr;
  for (const auto& g : *groups)
    if (g.is_object())
      if (const json* w = get(g, "weights"); w && w->is_object()) return w;
  return nullptr;
}

// Quantization-config keys that detect_format reads, and the JSON type each must have. One present with
// another type (a string "4" for bits, a number for sym) would otherwise read as absent, and the tensors'
// own values would be taken without a word while loaders that trust the config fail on it.
enum class KeyType { Int, Bool, String };
struct KnownKey { const char* key; KeyType type; };
constexpr KnownKey kQuantKeys[] = {
    {"bits", KeyType::Int},          {"w_bit", KeyType::Int},          {"group_size", KeyType::Int},
    {"q_group_size", KeyType::Int},  {"sym", KeyType::Bool},           {"zero_point", KeyType::Bool},
    {"desc_act", KeyType::Bool},     {"is_marlin_format", KeyType::Bool}, {"quant_method", KeyType::String},
    {"checkpoint_format", KeyType::String}, {"format", KeyType::String}, {"version", KeyType::String}};
constexpr KnownKey kCtWeightKeys[] = {{"num_bits", KeyType::Int}, {"group_size", KeyType::Int},
                                      {"symmetric", KeyType::Bool}, {"strategy", KeyType::String}};

bool has_type(const json& v, KeyType t) {
  return t == KeyType::Int ? v.is_number_integer() : t == KeyType::Bool ? v.is_boolean() : v.is_string();
}
const char* type_word(KeyType t) { return t == KeyType::Int ? "an integer" : t == KeyType::Bool ? "true or false" : "a string"; }

// One note per mistyped key ("config key ..."; verify reports these as problems).
template <size_t N>
void note_mistyped(const json& obj, const KnownKey (&keys)[N], const std::string& where, std::vector<std::string>& notes) {
  for (const KnownKey& k : keys)
    if (const json* v = get(obj, k.key); v && !has_type(*v, k.type))
      notes.push_back("config key " + where + k.key + " is " + v->dump() + ", not " + type_word(k.type));
}

// Integer keys of the right type must also hold a value a loader can use: a bit width of 2, 3, 4 or 8,
// a group size of -1 (one group per column) or 1..kMaxConfigGroup. Out of range they would read as the
// tensors' own values ("bits": 0 fell back to 4) and certify a checkpoint that loaders reject.
constexpr int64_t kMaxConfigGroup = int64_t(1) << 24;
bool valid_bits(int64_t b) { return b == 2 || b == 3 || b == 4 || b == 8; }
bool valid_group(int64_t g) { return g == -1 || (g >= 1 && g <= kMaxConfigGroup); }
void note_bad_values(const json& obj, const std::string& where, std::vector<std::string>& notes) {
  for (const char* key : {"bits", "w_bit", "num_bits"})
    if (const json* v = get(obj, key); v && v->is_number_integer()) {
      const bool ok = !v->is_number_unsigned() || v->get<uint64_t>() <= 8;
      const int64_t b = ok ? v->get<int64_t>() : 0;
      if (!ok || !valid_bits(b))
        notes.push_back("config key " + where + key + " is " + v->dump() + ", not 2, 3, 4 or 8");
    }
  for (const char* key : {"group_size", "q_group_size"})
    if (const json* v = get(obj, key); v && v->is_number_integer()) {
      const bool ok = !v->is_number_unsigned() || v->get<uint64_t>() <= uint64_t(kMaxConfigGroup);
      const int64_t g = ok ? v->get<int64_t>() : 0;
      if (!ok || !valid_group(g))
        notes.push_back("config key " + where + key + " is " + v->dump() + ", not -1 or 1.." +
                        std::to_string(kMaxConfigGroup));
    }
}

const TensorInfo& info(const Checkpoint& ck, const std::string& name) { return *ck.at(name).info; }

[[noreturn]] void shape_fail(const Checkpoint& ck, const std::string& tensor, const std::string& rule) {
  bad_data(ck.at(tensor).file->path().string() + ": " + tensor + ": " + rule);
}

std::string shape_str(const std::vector<int64_t>& s) {
  std::string r = "[";
  for (size_t i = 0; i < s.size(); ++i) r += (i ? ", " : "") + std::to_string(s[i]);
  return r + "]";
}

const TensorInfo& need_2d(const Checkpoint& ck, const std::string& name, std::initializer_list<DType> dts) {
  const TensorInfo& t = info(ck, name);
  if (t.shape.size() != 2) shape_fail(ck, name, "expected a 2-D tensor, got shape " + shape_str(t.shape));
  if (dts.size() && std::find(dts.begin(), dts.end(), t.dtype) == dts.end())
    shape_fail(ck, name, "unexpected dtype " + std::string(dtype_name(t.dtype)));
  return t;
}

// Little-endian int32 elements of a tensor (copied: mapped bytes need not be 4-aligned).
std::vector<int32_t> read_i32(const Checkpoint& ck, const std::string& name) {
  auto b = ck.data(name);
  std::vector<int32_t> v(b.size() / 4);
  if (!v.empty()) std::memcpy(v.data(), b.data(), v.size() * 4);
  return v;
}

// Group size implied by G scale rows over k inputs; `cfg` (from the config) wins when consistent.
int group_from_rows(const Checkpoint& ck, const std::string& scale_name, int64_t k, int64_t G, int cfg) {
  if (cfg > 0 && (k + cfg - 1) / cfg == G) return cfg;
  if (cfg == -1 && G == 1) return -1;
  if (G == 1) return -1;
  if (G > 0 && k % G == 0) return int(k / G);
  shape_fail(ck, scale_name, std::to_string(G) + " scale groups is not a whole group size of k = " + std::to_string(k));
}

// Modules the config tells loaders to leave unquantized (GPTQModel's "-:" dynamic rules; compressed-
// tensors' ignore list of names and "re:" patterns), both matched from the start of the module name as
// Python's re.match does, would be built as plain layers, whose weight these quantized tensors are not.
// The patterns come from the file: a length cap bounds std::regex's recursive compile, and the polynomial
// (Thompson) executor rules out backtracking blow-ups on nested quantifiers.
constexpr size_t kMaxSkipPattern = 256;
void note_skipped_modules(const json& qc, const std::vector<QuantizedModuleShape>& mods, std::vector<std::string>& notes) {
  auto first_match = [&](const std::string& pattern) -> std::string {
    if (pattern.size() > kMaxSkipPattern) {
      notes.push_back("a pattern in the quantization config is longer than " + std::to_string(kMaxSkipPattern) +
                      " characters: not matched against the modules");
      return "";
    }
    try {
      const std::regex re(pattern, std::regex::ECMAScript | std::regex_constants::__polynomial);
      for (const auto& m : mods)
        if (std::regex_search(m.prefix, re, std::regex_constants::match_continuous)) return m.prefix;
    } catch (const std::regex_error&) {
      notes.push_back("pattern \"" + pattern + "\" in the quantization config is not a regular expression marlinc reads");
    }
    return "";
  };
  if (const json* dyn = get(qc, "dynamic"); dyn && dyn->is_object())
    for (auto it = dyn->begin(); it != dyn->end(); ++it)
      if (it.key().rfind("-:", 0) == 0)
        if (const std::string hit = first_match(it.key().substr(2)); !hit.empty())
          notes.push_back("config's dynamic rule \"" + it.key() + "\" skips quantizing " + hit + " but the module is quantized");
  if (const json* ignore = get(qc, "ignore"); ignore && ignore->is_array())
    for (const auto& e : *ignore) {
      if (!e.is_string()) continue;
      const std::string v = e.get<std::string>();
      std::string hit;
      if (v.rfind("re:", 0) == 0) hit = first_match(v.substr(3));
      else if (std::any_of(mods.begin(), mods.end(), [&](const auto& m) { return m.prefix == v; })) hit = v;
      if (!hit.empty()) notes.push_back("config's ignore entry \"" + v + "\" leaves " + hit + " unquantized but the module is quantized");
    }
}

}  // namespace

std::string format_name(Format f) {
  switch (f) {
    case Format::Plain: return "plain";
    case Format::GptqV1: return "gptq-v1";
    case Format::GptqV2: return "gptq-v2";
    case Format::Marlin: return "marlin";
    case Format::Marlin24: return "marlin24";
    case Format::Awq: return "awq";
    case Format::CompressedTensorsPack: return "compressed-tensors-pack-quantized";
    case Format::CompressedTensorsMarlin24: return "compressed-tensors-marlin-24";
    case Format::Unknown: return "unknown";
  }
  return "unknown";
}

static bool kind_matches(Kind k, Format f) {
  switch (f) {
    case Format::GptqV1: case Format::GptqV2: case Format::Awq: return k == Kind::QWeight;
    case Format::Marlin: return k == Kind::Marlin;
    case Format::Marlin24: return k == Kind::Marlin24;
    case Format::CompressedTensorsPack: return k == Kind::CtPack;
    case Format::CompressedTensorsMarlin24: return k == Kind::CtMarlin24;
    default: return false;
  }
}

std::vector<std::string> quantized_modules(const Checkpoint& ck, Format f) {
  std::vector<std::string> out;
  for (const auto& [prefix, kind] : module_kinds(ck))
    if (kind_matches(kind, f)) out.push_back(prefix);
  return out;  // std::map iteration is already sorted
}

std::vector<QuantizedModuleShape> quantized_module_shapes(const Checkpoint& ck, const FormatInfo& fi,
                                                          std::vector<std::pair<std::string, std::string>>* malformed) {
  std::vector<QuantizedModuleShape> out;
  for (const std::string& p : quantized_modules(ck, fi.format)) {
   try {
    QuantizedModuleShape m;
    m.prefix = p;
    auto add = [&](const std::string& name) {
      if (!ck.contains(name)) return false;
      m.tensors.push_back(name);
      m.stored_bytes += info(ck, name).nbytes();
      return true;
    };
    switch (fi.format) {
      case Format::GptqV1: case Format::GptqV2: case Format::Awq: {
        const bool awq = fi.format == Format::Awq;
        const std::string qw = join(p, "qweight"), sc = join(p, "scales"), qz = join(p, "qzeros"), gi = join(p, "g_idx");
        const TensorInfo& w = need_2d(ck, qw, {DType::I32, DType::U32});
        const TensorInfo& s = need_2d(ck, sc, {});
        m.bits = fi.bits > 0 ? fi.bits : 4;
        // A GPTQ module's g_idx has k entries, which fixes its own bit width (mixed-bit `dynamic` files).
        if (!awq && ck.contains(gi)) {
          const int64_t k = info(ck, gi).numel();
          const int64_t b = k > 0 && (32 * w.shape[0]) % k == 0 ? 32 * w.shape[0] / k : 0;
          if (b == 2 || b == 4 || b == 8) m.bits = int(b);
        }
        const int pf = 32 / m.bits;
        m.n = s.shape[1];
        if (awq) {
          m.k = w.shape[0];
          if (w.shape[1] * pf != m.n)
            // The format was read as AWQ only because qweight's width differs from the scales' n, so a
            // broken GPTQ file lands here too: name both layouts.
            shape_fail(ck, qw, "qweight " + shape_str(w.shape) + " does not match scales " + shape_str(s.shape) +
                                   " at " + std::to_string(m.bits) + " bits: neither GPTQ's [k/" + std::to_string(pf) +
                                   ", n] nor AWQ's [k, n/" + std::to_string(pf) + "]");
        } else {
          m.k = w.shape[0] * pf;
          if (w.shape[1] != m.n)
            shape_fail(ck, qw, "GPTQ qweight " + shape_str(w.shape) + " does not match scales " + shape_str(s.shape) +
                                   " ([k/" + std::to_string(pf) + ", n])");
        }
        m.group_size = group_from_rows(ck, sc, m.k, s.shape[0], fi.group_size);
        add(qw); add(sc);
        if (add(qz)) {
          const TensorInfo& z = need_2d(ck, qz, {DType::I32, DType::U32});
          if (z.shape[0] != s.shape[0] || z.shape[1] * pf != m.n)
            shape_fail(ck, qz, "qzeros " + shape_str(z.shape) + " should be [" + std::to_string(s.shape[0]) + ", " +
                                   std::to_string(m.n / pf) + "]");
        }
        if (add(gi)) {
          const TensorInfo& g = info(ck, gi);
          if (g.numel() != m.k)
            shape_fail(ck, gi, "g_idx has " + std::to_string(g.numel()) + " entries, k = " + std::to_string(m.k));
        }
        break;
      }
      case Format::Marlin: case Format::Marlin24: {
        const bool sp = fi.format == Format::Marlin24;
        const std::string bn = join(p, sp ? "B_24" : "B");
        const std::string sn = sp ? marlin24_stored_name(ck, join(p, "s")) : join(p, "s");
        const std::string mn = marlin24_stored_name(ck, join(p, "B_meta"));
        if (!ck.contains(sn)) bad_data(ck.source().string() + ": " + p + ": Sparse-Marlin module has no scales (s or s_24)");
        const TensorInfo& B = need_2d(ck, bn, {DType::I32, DType::U32});
        const TensorInfo& s = need_2d(ck, sn, {DType::F16, DType::BF16});
        m.n = s.shape[1];
        if (m.n <= 0 || (2 * B.shape[1]) % m.n != 0)
          shape_fail(ck, bn, shape_str(B.shape) + " does not match scales " + shape_str(s.shape) + " (expect [k/" +
                                 (sp ? "32" : "16") + ", n*bits/2])");
        m.bits = int(2 * B.shape[1] / m.n);
        m.k = B.shape[0] * (sp ? 32 : 16);
        m.group_size = group_from_rows(ck, sn, m.k, s.shape[0], fi.group_size);
        add(bn); add(sn);
        if (sp) {
          add(mn);
          if (info(ck, mn).numel() * 16 != m.k * m.n)
            shape_fail(ck, mn, "2:4 metadata has " + std::to_string(info(ck, mn).numel()) + " entries, expected k*n/16 = " +
                                   std::to_string(m.k * m.n / 16));
        }
        break;
      }
      case Format::CompressedTensorsPack: {
        const std::string wp = join(p, "weight_packed"), ws = join(p, "weight_scale"), wsh = join(p, "weight_shape");
        const TensorInfo& w = need_2d(ck, wp, {DType::I32, DType::U32});
        const TensorInfo& s = need_2d(ck, ws, {});
        m.bits = fi.bits > 0 ? fi.bits : 4;
        m.n = w.shape[0];
        add(wp); add(ws);
        if (add(wsh)) {
          const TensorInfo& t = info(ck, wsh);
          auto b = ck.data(wsh);
          if (t.numel() != 2 || (t.dtype != DType::I64 && t.dtype != DType::I32))
            shape_fail(ck, wsh, "weight_shape must be 2 integers [n, k]");
          int64_t v[2];
          for (int i = 0; i < 2; ++i) {
            if (t.dtype == DType::I64) std::memcpy(&v[i], b.data() + 8 * i, 8);
            else { int32_t x; std::memcpy(&x, b.data() + 4 * i, 4); v[i] = x; }
          }
          m.bits = ct_module_bits(v[1], w.shape[1], m.bits);
          const int pf = 32 / m.bits;
          if (v[0] != m.n || (v[1] + pf - 1) / pf != w.shape[1])
            shape_fail(ck, wsh, "weight_shape [" + std::to_string(v[0]) + ", " + std::to_string(v[1]) +
                                    "] does not match weight_packed " + shape_str(w.shape));
          m.k = v[1];
        } else {
          m.k = w.shape[1] * (32 / m.bits);
        }
        if (s.shape[0] != m.n) shape_fail(ck, ws, "weight_scale " + shape_str(s.shape) + " should have n = " + std::to_string(m.n) + " rows");
        m.group_size = group_from_rows(ck, ws, m.k, s.shape[1], fi.group_size);
        add(join(p, "weight_zero_point"));
        add(join(p, "weight_g_idx"));
        break;
      }
      case Format::CompressedTensorsMarlin24: {
        const std::string wp = join(p, "weight_packed"), sp = join(p, "scale_packed"), mt = join(p, "meta");
        const TensorInfo& B = need_2d(ck, wp, {DType::I32, DType::U32});
        const TensorInfo& s = need_2d(ck, sp, {DType::F16, DType::BF16});
        m.n = s.shape[1];
        if (m.n <= 0 || (2 * B.shape[1]) % m.n != 0)
          shape_fail(ck, wp, shape_str(B.shape) + " does not match scale_packed " + shape_str(s.shape));
        m.bits = int(2 * B.shape[1] / m.n);
        m.k = B.shape[0] * 32;
        m.group_size = group_from_rows(ck, sp, m.k, s.shape[0], fi.group_size);
        add(wp); add(sp); add(mt);
        break;
      }
      default: break;
    }
    if (m.bits != 2 && m.bits != 3 && m.bits != 4 && m.bits != 8)
      bad_data(ck.source().string() + ": " + p + ": packed shapes imply " + std::to_string(m.bits) + " bits per weight");
    out.push_back(std::move(m));
   } catch (const Error& e) {
    if (!malformed || e.kind() != ErrorKind::BadData) throw;
    malformed->emplace_back(p, e.what());
   }
  }
  return out;
}

int ct_module_bits(int64_t k, int64_t packed_cols, int preferred) {
  auto fits = [&](int b) { return b > 0 && 32 % b == 0 && k >= 0 && (k + 32 / b - 1) / (32 / b) == packed_cols; };
  if (fits(preferred)) return preferred;
  for (int b : {4, 8, 2})
    if (fits(b)) return b;
  return preferred;
}

FormatInfo detect_format(const Checkpoint& ck) {
  FormatInfo fi;
  const json& qc = ck.quantize_config();
  for (const auto& c : ck.quantize_config_conflicts()) fi.notes.push_back("quantization configs disagree: " + c);
  note_mistyped(qc, kQuantKeys, "", fi.notes);
  note_bad_values(qc, "", fi.notes);
  if (const json* w = ct_weights(qc)) {
    note_mistyped(*w, kCtWeightKeys, "config_groups.*.weights.", fi.notes);
    note_bad_values(*w, "config_groups.*.weights.", fi.notes);
  }
  const std::string method = get_str(qc, "quant_method");
  std::string ckfmt = get_str(qc, "checkpoint_format");
  if (ckfmt.empty()) ckfmt = get_str(qc, "format");  // GPTQModel alias; compressed-tensors' format
  if (get_bool(qc, "is_marlin_format").value_or(false)) ckfmt = "marlin";
  fi.label_in_config = method.empty() ? ckfmt : method + (ckfmt.empty() ? "" : "/" + ckfmt);
  if (method.empty() && !get_str(qc, "version").empty()) fi.label_in_config = "awq?/" + get_str(qc, "version");

  // Counts of modules per packed family.
  std::map<Kind, int> counts;
  for (const auto& [p, k] : module_kinds(ck)) counts[k]++;
  if (counts.empty()) {
    fi.format = Format::Plain;
    for (const std::string& n : ck.tensor_names()) {
      const std::string leaf = split_tensor_name(n).leaf;
      if (leaf == "qweight" || leaf == "qzeros" || leaf == "B_24" || leaf == "weight_packed" || leaf == "B_meta") {
        fi.format = Format::Unknown;
        fi.notes.push_back(n + ": looks like a packed quantized tensor but its module lacks the companion tensors");
        break;
      }
    }
    if (!fi.label_in_config.empty())
      fi.notes.push_back("config names quantization \"" + fi.label_in_config + "\" but no quantized tensors were found");
    return fi;
  }
  if (counts.size() > 1) {
    fi.format = Format::Unknown;
    fi.notes.push_back("modules of several packed formats in one checkpoint (" + std::to_string(counts.size()) + " families)");
    return fi;
  }
  const Kind kind = counts.begin()->first;

  // Parameters from the config (with the §4.6 synonyms) and compressed-tensors' weights block.
  // Values note_bad_values refused read as absent: the tensors decide.
  auto bits_of = [](const json& j, const char* key) {
    const std::optional<int> v = get_int(j, key);
    return v && valid_bits(*v) ? v : std::nullopt;
  };
  auto group_of = [](const json& j, const char* key) {
    const std::optional<int> v = get_int(j, key);
    return v && valid_group(*v) ? v : std::nullopt;
  };
  std::optional<int> bits = bits_of(qc, "bits");
  if (!bits) bits = bits_of(qc, "w_bit");
  std::optional<int> group = group_of(qc, "group_size");
  if (!group) group = group_of(qc, "q_group_size");
  std::optional<bool> sym = get_bool(qc, "sym");
  if (auto zp = get_bool(qc, "zero_point")) sym = !*zp;
  std::optional<bool> desc = get_bool(qc, "desc_act");
  if (const json* w = ct_weights(qc)) {
    if (auto b = bits_of(*w, "num_bits")) bits = b;
    if (auto g = group_of(*w, "group_size")) group = g;
    else if (get_str(*w, "strategy") == "channel") group = -1;
    if (auto s = get_bool(*w, "symmetric")) sym = s;
    // Only "group" (alias "dynamic", or the older `true`) stores weight_g_idx and reorders at run time;
    // "weight" (alias "static") is how GPTQ ordered its columns while calibrating, with contiguous groups
    // (llm-compressor's default).
    const std::string order = get_str(*w, "actorder");
    desc = order == "group" || order == "dynamic" || get_bool(*w, "actorder").value_or(false);
  }
  // Per-module schemes: GPTQModel `dynamic` overrides ("+:regex" or a bare regex; "-:" skips a module)
  // and every compressed-tensors scheme. Only the values are kept: which module each names is a regex
  // or target match that loaders make; here a module's own shapes give its bits and group size.
  if (const json* dyn = get(qc, "dynamic"); dyn && dyn->is_object())
    for (auto it = dyn->begin(); it != dyn->end(); ++it) {
      if (it.key().rfind("-:", 0) == 0 || !it->is_object()) continue;
      if (auto b = bits_of(*it, "bits")) fi.other_bits.insert(*b);
      if (auto g = group_of(*it, "group_size")) fi.other_groups.insert(*g);
    }
  if (const json* groups = get(qc, "config_groups"); groups && groups->is_object())
    for (const auto& g : *groups)
      if (const json* w = g.is_object() ? get(g, "weights") : nullptr; w && w->is_object()) {
        if (auto b = bits_of(*w, "num_bits")) fi.other_bits.insert(*b);
        if (auto gs = group_of(*w, "group_size")) fi.other_groups.insert(*gs);
        else if (get_str(*w, "strategy") == "channel") fi.other_groups.insert(-1);
      }

  switch (kind) {
    case Kind::Marlin: fi.format = Format::Marlin; break;
    case Kind::Marlin24: fi.format = Format::Marlin24; break;
    case Kind::CtPack: fi.format = Format::CompressedTensorsPack; break;
    case Kind::CtMarlin24: fi.format = Format::CompressedTensorsMarlin24; break;
    case Kind::QWeight: {
      // GPTQ stores qweight [k/pf, n] (same n as scales), AWQ [k, n/pf]: the shapes decide, by majority
      // (one broken module must not turn a GPTQ checkpoint into an AWQ one).
      auto awq_layout = [&](const std::string& mp) -> std::optional<bool> {
        const TensorInfo &wi = info(ck, join(mp, "qweight")), &si = info(ck, join(mp, "scales"));
        if (wi.shape.size() != 2 || si.shape.size() != 2) return std::nullopt;  // broken: no vote
        return wi.shape[1] != si.shape[1];
      };
      const std::vector<std::string> qmods = quantized_modules(ck, Format::GptqV1);
      std::vector<std::optional<bool>> layouts;
      for (const std::string& mp : qmods) layouts.push_back(awq_layout(mp));
      const bool awq_shape = std::count(layouts.begin(), layouts.end(), std::optional<bool>(true)) >
                             std::count(layouts.begin(), layouts.end(), std::optional<bool>(false));
      // A module of the majority's layout (the first one when none could vote).
      const auto at = std::find(layouts.begin(), layouts.end(), std::optional<bool>(awq_shape));
      const std::string& p = qmods[at == layouts.end() ? 0 : size_t(at - layouts.begin())];
      const TensorInfo& w = need_2d(ck, join(p, "qweight"), {});
      fi.format = awq_shape ? Format::Awq : Format::GptqV1;
      const bool awq_label = method == "awq" || ckfmt == "gemm" || get_str(qc, "version") == "gemm";
      if (awq_shape != awq_label && !fi.label_in_config.empty())
        fi.notes.push_back(std::string("config label \"") + fi.label_in_config + "\" disagrees with tensor shapes, which are " +
                           (awq_shape ? "AWQ ([k, n/8] qweight)" : "GPTQ ([k/8, n] qweight)"));
      if (!awq_shape && ckfmt == "gptq_v2") fi.format = Format::GptqV2;
      if (!bits && !awq_shape && ck.contains(join(p, "g_idx"))) {
        const int64_t k = info(ck, join(p, "g_idx")).numel();
        if (k > 0 && (32 * w.shape[0]) % k == 0) bits = int(32 * w.shape[0] / k);
      }
      break;
    }
  }
  const bool marlin_kind = kind == Kind::Marlin || kind == Kind::Marlin24 || kind == Kind::CtMarlin24;
  // Loaders pick their kernel from the label, so a label naming another format is a disagreement:
  // dense Marlin is checkpoint_format "marlin" (or is_marlin_format), Sparse-Marlin "marlin_24", GPTQ
  // "gptq"/"gptq_v2" (or none), compressed-tensors quant_method "compressed-tensors".
  if (!fi.label_in_config.empty()) {
    const bool ct_method = method == "compressed-tensors";
    bool fits = true;
    switch (kind) {
      case Kind::Marlin:  // vLLM's legacy marlin loader also took quant_method "marlin" alone
        fits = (ckfmt == "marlin" && (method.empty() || method == "gptq" || method == "marlin")) ||
               (ckfmt.empty() && method == "marlin");
        break;
      case Kind::Marlin24: fits = ckfmt == "marlin_24" && (method.empty() || method == "gptq" || method == "gptq_marlin_24"); break;
      // compressed-tensors' format names the packing ("mixed-precision": each scheme names its own).
      case Kind::CtPack:
        fits = ct_method && (ckfmt.empty() || ckfmt == "pack-quantized" || ckfmt == "mixed-precision");
        break;
      case Kind::CtMarlin24:
        fits = ct_method && (ckfmt.empty() || ckfmt == "marlin-24" || ckfmt == "mixed-precision");
        break;
      // GPTQ tensors under quant_method "gptq" (or none), AWQ's under "awq" (or none) in its GEMM layout:
      // "marlin" would send GPTQ's tensors to the Marlin loader, GEMV is another layout of the same shapes.
      case Kind::QWeight:
        if (fi.format == Format::Awq) {
          fits = method.empty() || method == "awq";
          if (const std::string v = get_str(qc, "version"); !v.empty() && v != "gemm")
            fi.notes.push_back("config says AWQ version \"" + v + "\" but the tensors are in the GEMM layout ([k, n/8] qweight)");
        } else
          fits = (method.empty() || method == "gptq") && (ckfmt.empty() || ckfmt == "gptq" || ckfmt == "gptq_v2");
        break;
    }
    if (!fits) fi.notes.push_back("config label \"" + fi.label_in_config + "\" but the tensors are " + format_name(fi.format));
  }
  fi.bits = bits.value_or(0);
  fi.group_size = group.value_or(0);
  // Dense Marlin may carry zero points (`<p>.qzeros`, docs/FORMATS.md): its config's sym counts. The 2:4
  // formats have none.
  const bool sparse_kind = kind == Kind::Marlin24 || kind == Kind::CtMarlin24;
  fi.sym = sparse_kind ? true : sym.value_or(true);
  fi.desc_act = sparse_kind ? false : desc.value_or(false);

  // Modules whose shapes are broken are left to the caller (verify fails each as a layer); the rest
  // describe the checkpoint. All broken: the first error stands.
  std::vector<std::pair<std::string, std::string>> malformed;
  auto mods = quantized_module_shapes(ck, fi, &malformed);
  if (mods.empty() && !malformed.empty()) bad_data(malformed.front().second);
  note_skipped_modules(qc, mods, fi.notes);
  // The Marlin families' packed shapes fix the bit width; a config that says otherwise is wrong.
  if (marlin_kind && bits && *bits != mods.front().bits && !fi.other_bits.count(mods.front().bits))
    fi.notes.push_back("config says bits " + std::to_string(*bits) + " but the packed shapes of " + mods.front().prefix +
                       " imply " + std::to_string(mods.front().bits));
  if (!bits) {
    fi.bits = mods.front().bits;
    if (kind == Kind::QWeight || kind == Kind::CtPack)
      fi.notes.push_back("bits not in any config; assumed " + std::to_string(fi.bits));
  }
  if (!group) fi.group_size = mods.front().group_size;
  for (const auto& m : mods)
    if (m.group_size != fi.group_size && !(fi.group_size == int(m.k) && m.group_size == -1) &&
        !fi.other_groups.count(m.group_size)) {  // a group size the config assigns to some modules is no surprise
      fi.notes.push_back(m.prefix + ": group size " + std::to_string(m.group_size) + " from its scales differs from " +
                         std::to_string(fi.group_size));
      break;
    }

  if (fi.format == Format::GptqV1 || fi.format == Format::GptqV2) {
    // v1 stores z-1, v2 stores z: for symmetric quantization every field is 2^(b-1)-1 (v1) or 2^(b-1) (v2).
    const bool labelled_v2 = fi.format == Format::GptqV2;
    int v1 = 0, v2 = 0, other = 0;
    bool act_order_data = false;
    if (fi.sym) {
      for (const auto& m : mods) {
        const std::string qz = join(m.prefix, "qzeros");
        if (!ck.contains(qz) || (m.bits != 2 && m.bits != 4 && m.bits != 8)) continue;
        // Each module at its own width (mixed-bit files).
        const uint32_t mask = (1u << m.bits) - 1, z2 = 1u << (m.bits - 1), z1 = z2 - 1;
        bool all1 = true, all2 = true;
        for (int32_t wd : read_i32(ck, qz))
          for (int sh = 0; sh < 32; sh += m.bits) {
            const uint32_t f = (uint32_t(wd) >> sh) & mask;
            all1 &= f == z1;
            all2 &= f == z2;
          }
        if (all1) ++v1; else if (all2) ++v2; else ++other;
      }
    }
    for (const auto& m : mods) {
      const std::string gi = join(m.prefix, "g_idx");
      if (!ck.contains(gi) || m.group_size <= 0 || act_order_data) continue;
      auto g = read_i32(ck, gi);
      for (size_t i = 0; i < g.size(); ++i)
        if (g[i] != int32_t(int64_t(i) / m.group_size)) { act_order_data = true; break; }
    }
    const std::string label = fi.label_in_config.empty() ? "no config label" : "config says \"" + fi.label_in_config + "\"";
    if (v2 > 0 && v1 == 0 && other == 0) {
      fi.format = Format::GptqV2;
      if (!labelled_v2) fi.notes.push_back(label + " (v1) but qzeros hold v2 values (" + std::to_string(1 << (fi.bits - 1)) + "): treated as gptq-v2");
    } else if (v1 > 0 && v2 == 0 && other == 0) {
      fi.format = Format::GptqV1;
      if (labelled_v2) fi.notes.push_back(label + " (v2) but qzeros hold v1 values (" + std::to_string((1 << (fi.bits - 1)) - 1) + "): treated as gptq-v1");
    } else if (v1 + v2 + other > 0) {
      fi.notes.push_back("symmetric config but qzeros are not uniformly v1 or v2 (" + std::to_string(v1) + " v1, " +
                         std::to_string(v2) + " v2, " + std::to_string(other) + " other modules): kept " + format_name(fi.format));
    }
    if (act_order_data && desc == std::optional<bool>(false)) {
      // vLLM reads g_idx only when desc_act says so: it would compute these layers with k // group_size.
      fi.notes.push_back("config says desc_act false but g_idx is not k // group_size (an act-order checkpoint)");
    } else if (act_order_data && !fi.desc_act) {
      fi.desc_act = true;
      // Absent from a config that exists, loaders take desc_act as false (transformers) or refuse (vLLM).
      fi.notes.push_back(ck.quantize_config().empty()
                             ? "g_idx is not k // group_size: act-order (desc_act) checkpoint"
                             : "config has no desc_act but g_idx is not k // group_size (an act-order checkpoint): "
                               "loaders that default desc_act to false ignore g_idx");
    } else if (fi.desc_act && !act_order_data) {
      // GPTQ's static groups: act-order that left every row in its group; read alike either way.
      fi.notes.push_back("desc_act is set and every g_idx is trivial (k // group_size)");
    }
  }
  return fi;
}

TensorName split_tensor_name(const std::string& name) {
  const size_t dot = name.rfind('.');
  if (dot == std::string::npos) return {"", name};
  return {name.substr(0, dot), name.substr(dot + 1)};
}

std::string join_tensor_name(const std::string& prefix, const std::string& leaf) {
  return prefix.empty() ? leaf : prefix + "." + leaf;
}

std::string marlin24_stored_name(const Checkpoint& ck, const std::string& name) {
  if (ck.contains(name)) return name;
  const TensorName t = split_tensor_name(name);
  const std::string alias = t.leaf == "B_meta" ? "meta" : t.leaf == "s" ? "s_24" : "";
  return !alias.empty() && ck.contains(join_tensor_name(t.prefix, alias)) ? join_tensor_name(t.prefix, alias) : name;
}

MarlinRuleCheck marlin_compatible(int64_t k, int64_t n, int group_size, int bits, bool sparse24) {
  MarlinRuleCheck r;
  auto fail_rule = [&](std::string s) { r.ok = false; r.rule = std::move(s); return r; };
  const std::string kn = " (k = " + std::to_string(k) + ", n = " + std::to_string(n) + ")";
  if (bits != 4 && bits != 8) return fail_rule("bits must be 4 or 8 (got " + std::to_string(bits) + ")");
  if (k % 128 != 0) return fail_rule("k % 128 == 0 required (thread_k = 128)" + kn);
  const int g = group_size == k ? -1 : group_size;  // one group over all of k is per-channel (§9.16)
  if (sparse24) {
    if (n % 256 != 0) return fail_rule("n % 256 == 0 required for 2:4 at every batch size (thread_m = 256 for batch > 16)" + kn);
    if (g != -1 && g != 128) return fail_rule("2:4 group size must be -1 or 128 (got " + std::to_string(group_size) + ")");
    return r;
  }
  if (n % 64 != 0) return fail_rule("n % 64 == 0 required (vLLM gptq_marlin min thread_n = 64)" + kn);
  if (g != -1 && g != 32 && g != 64 && g != 128)
    return fail_rule("group size must be -1, 32, 64 or 128 (got " + std::to_string(group_size) + ")");
  if (g > 0 && k % g != 0) return fail_rule("group size " + std::to_string(g) + " must divide k = " + std::to_string(k));
  std::vector<std::string> caveats;
  if (n % 256 != 0)
    caveats.push_back(n % 128 == 0 ? "IST kernel: n % 256 != 0, only batch <= 16" : "IST kernel: n % 128 != 0, vLLM only");
  if (g == 32 || g == 64) caveats.push_back("IST kernel: group " + std::to_string(g) + " unsupported, vLLM only");
  for (size_t i = 0; i < caveats.size(); ++i) r.rule += (i ? "; " : "") + caveats[i];
  return r;
}

}  // namespace marlinc
