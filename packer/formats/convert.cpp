#include "packer/formats/convert.h"

#include <algorithm>
#include <cctype>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <condition_variable>
#include <deque>
#include <exception>
#include <map>
#include <mutex>
#include <set>
#include <thread>
#include <tuple>

#include <omp.h>
#include <sys/mman.h>
#include <unistd.h>

#include "checkpoint/error.h"
#include "checkpoint/writer.h"
#include "packer/formats/common.h"

namespace marlinc {

namespace fs = std::filesystem;
using json = nlohmann::json;

uint64_t parse_size(std::string_view s) {
  const std::string what = "size '" + std::string(s) + "'";
  const std::string form = ": expected a number with an optional unit (e.g. 5GB, 500MB, 2GiB, 1.5GB)";
  auto is_space = [](char c) { return std::isspace(static_cast<unsigned char>(c)) != 0; };
  auto is_digit = [](char c) { return std::isdigit(static_cast<unsigned char>(c)) != 0; };
  size_t i = 0, e = s.size();
  while (i < e && is_space(s[i])) ++i;
  while (e > i && is_space(s[e - 1])) --e;
  // digits [. digits], then optional spaces, then the unit
  const size_t num0 = i;
  size_t digits = 0;
  while (i < e && is_digit(s[i])) ++i, ++digits;
  if (i < e && s[i] == '.') {
    ++i;
    while (i < e && is_digit(s[i])) ++i, ++digits;
  }
  if (digits == 0) bad_usage(what + form);
  const std::string number(s.substr(num0, i - num0));
  while (i < e && is_space(s[i])) ++i;
  std::string unit;
  for (; i < e; ++i) unit += char(std::toupper(static_cast<unsigned char>(s[i])));
  static const std::map<std::string, double> units = {
      {"", 1}, {"B", 1}, {"KB", 1e3}, {"MB", 1e6}, {"GB", 1e9}, {"TB", 1e12},
      {"KIB", 1024.0}, {"MIB", 1048576.0}, {"GIB", 1073741824.0}, {"TIB", 1099511627776.0}};
  auto u = units.find(unit);
  if (u == units.end()) bad_usage(what + ": unknown unit '" + unit + "' (use B, KB, MB, GB, TB, KiB, MiB, GiB, TiB)");
  const double bytes = std::strtod(number.c_str(), nullptr) * u->second;
  if (!(bytes < 9.2e18)) bad_usage(what + ": larger than 2^63 bytes");
  if (u->second == 1 && bytes != std::floor(bytes)) bad_usage(what + ": a fraction of a byte");
  const uint64_t r = uint64_t(std::llround(bytes));  // 1.1GiB: to the nearest byte
  // "0" means one file; a fraction that rounds to 0 bytes is a typo, not that.
  if (r == 0 && bytes != 0) bad_usage(what + ": rounds to 0 bytes (0 means no sharding; a shard needs at least 1 byte)");
  return r;
}

json ConvertReport::to_json() const {
  json mods = json::array();
  for (const auto& m : modules)
    mods.push_back({{"name", m.prefix}, {"k", m.k}, {"n", m.n}, {"bits", m.bits}, {"group_size", m.group_size},
                    {"from", m.from}, {"to", m.to}, {"rule", m.rule.empty() ? json(nullptr) : json(m.rule)},
                    {"bytes_in", m.bytes_in}, {"bytes_out", m.bytes_out}, {"seconds", m.seconds}, {"notes", m.notes}});
  json inc = json::array();
  for (const auto& m : incompatible)
    inc.push_back({{"name", m.prefix}, {"k", m.k}, {"n", m.n}, {"bits", m.bits}, {"group_size", m.group_size},
                   {"rule", m.rule}, {"tensors", m.tensors}});
  return {{"ok", ok},
          {"input", input},
          {"output", ok ? json(output) : json(nullptr)},
          {"target", target},
          {"source_format", source_format},
          {"source_label", source_label},
          {"notes", notes},
          {"modules", mods},
          {"incompatible", inc},
          {"passthrough_tensors", passthrough_tensors},
          {"passthrough_bytes", passthrough_bytes},
          {"copied_files", copied_files},
          {"written_files", written_files},
          {"bytes_in", bytes_in},
          {"bytes_out", bytes_out},
          {"shards", shards},
          {"seconds", seconds}};
}

namespace {

double since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// One background thread performs every CheckpointWriter::write in submission order, so reading and
// repacking module i+1 overlaps the copy into the page cache (and writeback throttling) of module i,
// and the big pass-through tensors are written while the first modules are converted. Owned buffers
// waiting in the queue are bounded by `max_pending` bytes: memory stays at about two layers.
class WriteQueue {
 public:
  WriteQueue(CheckpointWriter& w, uint64_t max_pending) : w_(w), max_pending_(max_pending) {
    th_ = std::thread([this] { loop(); });
  }
  WriteQueue(const WriteQueue&) = delete;
  WriteQueue& operator=(const WriteQueue&) = delete;
  ~WriteQueue() { stop(); }

  // A tensor viewed in the (mapped) input: nothing is copied until the writer thread writes it.
  void push_view(const std::string& name, std::span<const uint8_t> bytes) { push(Job{name, bytes, {}}); }
  void push_owned(std::string name, std::vector<uint8_t> bytes) {
    Job j{std::move(name), {}, std::move(bytes)};
    j.view = j.owned;  // the buffer does not move when the vector does
    push(std::move(j));
  }
  // Waits until everything is written; rethrows the writer's error.
  void finish() {
    std::unique_lock<std::mutex> lk(m_);
    cv_.wait(lk, [&] { return (jobs_.empty() && !busy_) || err_; });
    if (err_) std::rethrow_exception(err_);
  }

 private:
  struct Job {
    std::string name;
    std::span<const uint8_t> view;
    std::vector<uint8_t> owned;
  };
  void push(Job j) {
    std::unique_lock<std::mutex> lk(m_);
    const uint64_t add = j.owned.size();
    cv_.wait(lk, [&] { return pending_ == 0 || pending_ + add <= max_pending_ || err_; });
    if (err_) std::rethrow_exception(err_);
    pending_ += add;
    jobs_.push_back(std::move(j));
    cv_.notify_all();
  }
  void loop() {
    for (;;) {
      Job j;
      {
        std::unique_lock<std::mutex> lk(m_);
        cv_.wait(lk, [&] { return !jobs_.empty() || stop_; });
        if (jobs_.empty()) return;
        j = std::move(jobs_.front());
        jobs_.pop_front();
        busy_ = true;
      }
      try {
        w_.write(j.name, j.view);
      } catch (...) {
        std::lock_guard<std::mutex> lk(m_);
        err_ = std::current_exception();
      }
      std::lock_guard<std::mutex> lk(m_);
      pending_ -= j.owned.size();
      busy_ = false;
      cv_.notify_all();
      if (err_) return;
    }
  }
  void stop() {
    {
      std::lock_guard<std::mutex> lk(m_);
      stop_ = true;
      jobs_.clear();
      cv_.notify_all();
    }
    if (th_.joinable()) th_.join();
  }
  CheckpointWriter& w_;
  const uint64_t max_pending_;
  std::mutex m_;
  std::condition_variable cv_;
  std::deque<Job> jobs_;
  uint64_t pending_ = 0;
  bool busy_ = false, stop_ = false;
  std::exception_ptr err_;
  std::thread th_;
};

// While the writer thread streams bytes into the page cache, the repacking runs on one thread fewer,
// so the two do not fight for cores (on 2 cores OpenMP's spin-waiting otherwise starves the writer).
// Restores the caller's setting on exit.
class OmpThreadsGuard {
 public:
  OmpThreadsGuard() : prev_(omp_get_max_threads()) { omp_set_num_threads(std::max(1, prev_ - 1)); }
  ~OmpThreadsGuard() { omp_set_num_threads(prev_); }
  OmpThreadsGuard(const OmpThreadsGuard&) = delete;
  OmpThreadsGuard& operator=(const OmpThreadsGuard&) = delete;

 private:
  int prev_;
};

// Asks the kernel to start reading a mapped byte range now (advice only: failures are harmless).
void prefetch(std::span<const uint8_t> b) {
  if (b.empty()) return;
  static const uintptr_t page = uintptr_t(::sysconf(_SC_PAGESIZE));
  const uintptr_t lo = reinterpret_cast<uintptr_t>(b.data()) & ~(page - 1);
  const uintptr_t hi = reinterpret_cast<uintptr_t>(b.data()) + b.size();
  ::madvise(reinterpret_cast<void*>(lo), hi - lo, MADV_WILLNEED);
}

int effective_group(const ModuleDesc& d) { return d.groups == 1 ? -1 : d.group_size; }

// The (bits, group) that fits most modules becomes the checkpoint-wide value; the rest are overrides.
// A module with one scale row fits both group -1 and group k: loaders that read only the top-level
// group_size (legacy Marlin, marlin_24, AutoGPTQ) size its scales [1, n] either way, so layers with
// k == group size must not pull a grouped checkpoint to -1. Ties go to the source's group size, then
// to a grouped value over -1. For Marlin targets the group k counts only where it is one the Marlin loaders
// accept (32, 64, 128): a checkpoint of one-row layers 256 deep says -1, not 256.
void summarise_schemes(const std::vector<const ModuleDesc*>& conv, int source_group, TargetFormat to,
                       QuantSummary& s) {
  using Scheme = std::pair<int, int>;  // (bits, group)
  const bool marlin = to == TargetFormat::Marlin || to == TargetFormat::Marlin24;
  auto fits = [&](const ModuleDesc& d) {
    std::vector<Scheme> v{{d.bits, effective_group(d)}};
    if (d.groups == 1 && d.k <= INT32_MAX && (!marlin || d.k == 32 || d.k == 64 || d.k == 128))
      v.push_back({d.bits, int(d.k)});
    return v;
  };
  std::map<Scheme, size_t> count;  // scheme -> modules it fits
  for (auto* d : conv)
    for (const Scheme& sc : fits(*d)) ++count[sc];
  Scheme best{4, 128};
  std::tuple<size_t, bool, bool> best_key{0, false, false};
  for (const auto& [sc, c] : count) {
    const std::tuple<size_t, bool, bool> key{c, sc.second == source_group, sc.second != -1};
    if (key > best_key) best = sc, best_key = key;
  }
  s.bits = best.first;
  s.group_size = best.second;
  for (auto* d : conv) {
    const auto f = fits(*d);
    if (std::find(f.begin(), f.end(), best) == f.end()) s.overrides.push_back({d->prefix, f.front()});
  }
}

// The source's `marlinc` record of how it was quantized (method, clip, damp, sparsity, calibration) stays
// with the weights: `verify --reference` reads its `method` (GPTQ moves weights by several steps by
// design). The target's own extension keys (act_order, zero_points, doc) come from this conversion.
void carry_quantization_record(const json& src_quant, TargetConfig& cfg) {
  auto rec = src_quant.find("marlinc");
  if (rec == src_quant.end() || !rec->is_object()) return;
  static const std::set<std::string> own = {"act_order", "zero_points", "doc"};
  auto put = [&](json& q) {
    json& m = q["marlinc"];
    if (!m.is_object()) m = json::object();
    for (auto it = rec->begin(); it != rec->end(); ++it)
      if (!own.count(it.key())) m[it.key()] = it.value();
  };
  put(cfg.config["quantization_config"]);
  if (cfg.quantize_config) put(*cfg.quantize_config);
}

}  // namespace

ConvertReport convert_checkpoint(const fs::path& in, const fs::path& out, const ConvertOptions& opts) {
  const auto t_start = std::chrono::steady_clock::now();
  ConvertReport rep;
  rep.input = in.string();
  rep.output = out.string();
  rep.target = target_name(opts.to);

  Checkpoint ck = Checkpoint::open(in);
  check_output_not_input(ck.dir(), out);
  const FormatInfo fi = detect_format(ck);
  rep.source_format = format_name(fi.format);
  rep.source_label = fi.label_in_config;
  rep.notes = fi.notes;
  if (fi.format == Format::Plain)
    bad_usage(ck.source().string() + ": holds no quantized modules (plain weights); `marlinc quantize` makes them");
  if (fi.format == Format::Unknown)
    bad_data(ck.source().string() + ": quantized-looking tensors that fit no supported format" +
             (fi.notes.empty() ? std::string() : " (" + fmt::join(fi.notes, "; ") + ")"));

  // 1. Describe every module from its small tensors and check the target's rules before writing anything.
  std::vector<ModuleDesc> descs = describe_modules(ck, fi);
  if (descs.empty()) bad_data(ck.source().string() + ": detected " + rep.source_format + " but found no quantized modules");
  std::vector<std::string> rules(descs.size());
  std::map<std::string, size_t> note_count;
  if (opts.tp < 1) bad_usage("--tp " + std::to_string(opts.tp) + ": the tensor-parallel size is at least 1");
  const TpHeads heads = tp_heads(ck.config());
  for (size_t i = 0; i < descs.size(); ++i) {
    rules[i] = target_rule(opts.to, descs[i]);
    if (rules[i].empty()) rules[i] = target_rule_tp(opts.to, descs[i], opts.tp, heads);
    if (!rules[i].empty()) {
      const ModuleDesc& d = descs[i];
      rep.incompatible.push_back({d.prefix, d.k, d.n, d.bits, effective_group(d), rules[i], d.tensors});
    }
    for (const auto& nt : descs[i].notes) ++note_count[nt];
    // The tensors decide a module's bit width; a config that names another (and no override for it) is noted.
    if (fi.bits > 0 && descs[i].bits != fi.bits && !fi.other_bits.count(descs[i].bits))
      ++note_count["the config says bits = " + std::to_string(fi.bits) + " but the tensors hold " +
                   std::to_string(descs[i].bits) + "-bit codes, which the conversion keeps"];
  }
  // AWQ and marlin_24 configs hold one bits/group_size for the whole checkpoint and their loaders read no
  // per-module overrides: a module of another scheme is incompatible there.
  if (opts.to == TargetFormat::Awq || opts.to == TargetFormat::Marlin24) {
    std::vector<const ModuleDesc*> fit;
    for (size_t i = 0; i < descs.size(); ++i)
      if (rules[i].empty()) fit.push_back(&descs[i]);
    QuantSummary probe;
    summarise_schemes(fit, fi.group_size, opts.to, probe);
    std::set<std::string> odd;
    for (const auto& o : probe.overrides) odd.insert(o.first);
    for (size_t i = 0; i < descs.size(); ++i) {
      const ModuleDesc& d = descs[i];
      if (!rules[i].empty() || !odd.count(d.prefix)) continue;
      rules[i] = rep.target + " has one bit width and group size per checkpoint (here " + std::to_string(probe.bits) +
                 "-bit, group " + std::to_string(probe.group_size) + "); this layer is " + std::to_string(d.bits) +
                 "-bit, group " + std::to_string(effective_group(d));
      rep.incompatible.push_back({d.prefix, d.k, d.n, d.bits, effective_group(d), rules[i], d.tensors});
    }
  }
  for (const auto& [nt, c] : note_count)
    rep.notes.push_back(c == 1 ? nt : nt + " (" + std::to_string(c) + " modules)");
  if (!rep.incompatible.empty() && !opts.keep_incompatible) {
    rep.ok = false;
    rep.seconds = since(t_start);
    return rep;
  }

  // 2. Plan: pass-through tensors keep name/dtype/shape; modules get the target's tensors.
  std::set<std::string> consumed;
  for (const auto& d : descs) consumed.insert(d.tensors.begin(), d.tensors.end());
  std::set<std::string> module_prefixes;
  for (const auto& d : descs) module_prefixes.insert(d.prefix);
  std::vector<TensorSpec> plan;
  std::vector<std::string> passthrough;
  QuantSummary sum;
  // Leaves that only quantized modules have: one left over belongs to a module missing a companion
  // tensor (e.g. weight_scale without weight_packed), which would pass through as a dangling tensor. In a
  // Marlin checkpoint the short leaves (B, s, meta, ...) are its modules' own, so a B without its s counts too.
  const bool marlin_source = fi.format == Format::Marlin || fi.format == Format::Marlin24;
  for (const auto& name : ck.tensor_names()) {
    if (consumed.count(name)) continue;
    const TensorInfo& t = *ck.at(name).info;
    if (is_quant_leaf(name, marlin_source))
      bad_data(ck.source().string() + ": " + name + ": a quantization tensor of no complete " + rep.source_format +
               " module (the module lacks a companion tensor, e.g. its packed weight or scales)");
    plan.push_back({name, t.dtype, t.shape});
    passthrough.push_back(name);
    rep.passthrough_bytes += t.nbytes();
  }
  sum.plain_linears = unquantized_linears(ck, [&](const std::string& p) { return module_prefixes.count(p) > 0; });
  rep.passthrough_tensors = passthrough.size();
  std::vector<std::vector<TensorSpec>> module_plans(descs.size());
  std::vector<const ModuleDesc*> converted;
  bool all_sym = true, any_act = false;
  for (size_t i = 0; i < descs.size(); ++i)
    if (rules[i].empty()) {
      all_sym = all_sym && descs[i].sym;
      any_act = any_act || descs[i].act_order;
    }
  // The config's sym / desc_act hold for every module (ModuleLayout).
  const ModuleLayout layout{!all_sym, any_act};
  if (opts.to == TargetFormat::CompressedTensors && any_act)
    rep.notes.push_back("act-order (g_idx) modules are written with actorder \"group\", which compressed-tensors "
                        "0.20 and later refuse (they removed it); vLLM releases that pin an earlier "
                        "compressed-tensors load it, and --to gptq or --to marlin keep g_idx everywhere");
  for (size_t i = 0; i < descs.size(); ++i) {
    const ModuleDesc& d = descs[i];
    if (rules[i].empty()) {
      module_plans[i] = plan_module(opts.to, d, layout);
      converted.push_back(&d);
      sum.lm_head_quantized = sum.lm_head_quantized || d.prefix == "lm_head";
    } else {
      module_plans[i] = {dequantized_spec(d)};
      sum.dequantized.push_back(d.prefix);
    }
    plan.insert(plan.end(), module_plans[i].begin(), module_plans[i].end());
  }
  {
    std::vector<std::string> names;
    for (const auto& s : plan) names.push_back(s.name);
    std::sort(names.begin(), names.end());
    auto dup = std::adjacent_find(names.begin(), names.end());
    if (dup != names.end())
      bad_data(*dup + ": the " + rep.target + " output would hold this tensor twice (a source tensor already has the "
               "name a converted module needs)");
  }
  if (opts.to == TargetFormat::Marlin24)
    for (const auto& p : sum.dequantized)
      if (p.find("lm_head") == std::string::npos)
        bad_usage(p + ": --keep-incompatible would leave it as plain weights, which a marlin_24 checkpoint cannot hold "
                  "(its loaders apply Sparse-Marlin to every linear layer and read no skip list); use --to marlin or gptq");
  summarise_schemes(converted, fi.group_size, opts.to, sum);
  sum.sym = all_sym;
  sum.desc_act = any_act;
  sum.act_order_marlin = opts.to == TargetFormat::Marlin && any_act;
  if (sum.act_order_marlin) rep.notes.push_back(kMarlinActOrderNote);
  sum.zero_points_marlin = opts.to == TargetFormat::Marlin && !all_sym;
  TargetConfig cfg = target_config(opts.to, ck.config(), ck.quantize_config(), sum);
  carry_quantization_record(ck.quantize_config(), cfg);

  if (opts.on_start) opts.on_start(rep);

  // 3. Stream. Nothing is visible at `out` until commit(); any throw removes the temporary output.
  CheckpointWriter w(out, plan, WriterOptions{opts.max_shard_bytes, "model", opts.overwrite});
  WriteQueue wq(w, 256ull << 20);
  OmpThreadsGuard omp_guard;
  // Work in the order the bytes lie in the source files (pass-through tensors and modules interleaved,
  // a module at its first tensor), so a cold input is read nearly sequentially; the next module's
  // tensors are prefetched (MADV_WILLNEED) while the current one is repacked.
  struct Work {
    bool module;
    size_t index;  // into descs, or into passthrough
  };
  std::vector<Work> order;
  {
    std::map<std::string, size_t> module_of, pass_of;
    for (size_t i = 0; i < descs.size(); ++i)
      for (const auto& t : descs[i].tensors) module_of[t] = i;
    for (size_t i = 0; i < passthrough.size(); ++i) pass_of[passthrough[i]] = i;
    std::vector<uint8_t> seen(descs.size(), 0);
    for (const auto& f : ck.files())
      for (const auto& t : f.tensors()) {
        if (auto m = module_of.find(t.name); m != module_of.end()) {
          if (!seen[m->second]) order.push_back({true, m->second}), seen[m->second] = 1;
        } else if (auto p = pass_of.find(t.name); p != pass_of.end()) {
          order.push_back({false, p->second});
        }
      }
  }
  for (size_t wi = 0; wi < order.size(); ++wi) {
    for (size_t nx = wi + 1; nx < order.size(); ++nx)
      if (order[nx].module) {
        for (const auto& t : descs[order[nx].index].tensors) prefetch(ck.data(t));
        break;
      }
    if (!order[wi].module) {
      wq.push_view(passthrough[order[wi].index], ck.data(passthrough[order[wi].index]));
      continue;
    }
    const size_t i = order[wi].index;
    const ModuleDesc& d = descs[i];
    const auto t0 = std::chrono::steady_clock::now();
    ConvertedModule m{d.prefix, d.k, d.n, d.bits, effective_group(d), format_name(d.format),
                      rules[i].empty() ? rep.target : "dequantized", rules[i], d.stored_bytes, 0, 0, d.notes};
    QuantizedLinear q = read_module(ck, d, fi);
    std::vector<PackedTensor> tensors;
    if (rules[i].empty()) tensors = write_module(opts.to, q, layout);
    else tensors.push_back(write_dequantized(q));
    if (tensors.size() != module_plans[i].size())
      fail(ErrorKind::Internal, d.prefix + ": writer produced " + std::to_string(tensors.size()) +
                                    " tensors, the plan has " + std::to_string(module_plans[i].size()));
    for (size_t j = 0; j < tensors.size(); ++j) {
      const TensorSpec& a = tensors[j].spec;
      const TensorSpec& b = module_plans[i][j];
      if (a.name != b.name || a.dtype != b.dtype || a.shape != b.shape)
        fail(ErrorKind::Internal, d.prefix + ": written tensor " + a.name + " " + fmt::shape_str(a.shape) +
                                      " differs from the planned " + b.name + " " + fmt::shape_str(b.shape));
      m.bytes_out += tensors[j].bytes.size();
      wq.push_owned(a.name, std::move(tensors[j].bytes));
    }
    m.seconds = since(t0);
    rep.modules.push_back(m);
    if (opts.on_module) opts.on_module(rep.modules.back(), rep.modules.size() - 1, descs.size());
  }

  std::sort(rep.modules.begin(), rep.modules.end(),
            [](const ConvertedModule& a, const ConvertedModule& b) { return a.prefix < b.prefix; });
  wq.finish();
  w.add_file("config.json", cfg.config.dump(2) + "\n");
  rep.written_files.push_back("config.json");
  if (cfg.quantize_config) {
    w.add_file("quantize_config.json", cfg.quantize_config->dump(2) + "\n");
    rep.written_files.push_back("quantize_config.json");
  }
  rep.copied_files = copy_non_tensor_files(ck.dir(), w);
  rep.shards = w.num_shards();
  w.commit();
  if (const std::string n = leftover_note(w); !n.empty()) rep.notes.push_back(n);

  for (const auto& f : ck.files())
    for (const auto& t : f.tensors()) rep.bytes_in += t.nbytes();
  for (const auto& s : plan) {
    uint64_t b = dtype_size(s.dtype);
    for (int64_t x : s.shape) b *= uint64_t(x);
    rep.bytes_out += b;
  }
  rep.ok = true;
  rep.seconds = since(t_start);
  return rep;
}

}  // namespace marlinc
