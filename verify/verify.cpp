#include "verify/verify.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <ctime>
#include <future>
#include <map>
#include <set>

#include "checkpoint/checkpoint.h"
#include "checkpoint/convert_dtype.h"
#include "checkpoint/error.h"
#include "checkpoint/format.h"
#include "checkpoint/half.h"
#include "checkpoint/sha256.h"
#include "packer/adapters.h"
#include "verify/arith.h"
#include "verify/gpu_gemm.h"
#include "verify/reference_error.h"
#include "verify/reference_tensors.h"

namespace marlinc {

namespace {

// The CPU arithmetic check evaluates at most this many output columns per layer (all of them on the
// GPU): enough to exercise every 64-column tile pattern while keeping an 8B model's check in minutes.
constexpr int64_t kCpuMaxColumns = 256;
// Rows of random activations for the --reference output error.
constexpr int kReferenceRows = 32;
// Reference errors below this are never called outliers, however their peers do.
constexpr double kOutlierFloor = 1e-3;
// No weight of a kept position may sit further than this from its reference, in quantization steps of
// its own scale, in a layer that rounds to nearest (below): rounding gives at most 0.5, clipping a few;
// a flipped high code bit gives about 8.
constexpr double kMaxStepError = 6.0;
// A layer rounds to nearest (RTN, with or without a clip search) where at most this fraction of its kept
// weights sit more than kNearStep steps from their originals; GPTQ's error feedback and SparseGPT move
// many more, some by more than kMaxStepError, so the step gate applies to the first kind only. Measured
// on the sample's outputs (docs/FORMATS.md, "the yardsticks"): RTN 0.5-0.7%, GPTQ 9-24%, SparseGPT 2:4 37-65%.
// Decided from the data, not from the checkpoint's config, so a file cannot ask to be checked less.
constexpr double kNearStep = 0.6, kRtnMaxFarFraction = 0.02;

std::optional<TargetFormat> writer_for(Format f) {
  switch (f) {
    case Format::Marlin: return TargetFormat::Marlin;
    case Format::Marlin24: return TargetFormat::Marlin24;
    case Format::GptqV1: return TargetFormat::GptqV1;
    case Format::GptqV2: return TargetFormat::GptqV2;
    case Format::CompressedTensorsPack: return TargetFormat::CompressedTensors;
    case Format::Awq: return TargetFormat::Awq;
    default: return std::nullopt;
  }
}

bool is_sparse(Format f) { return f == Format::Marlin24 || f == Format::CompressedTensorsMarlin24; }

// Config files whose bytes the certificate pins: each changes how loaders read the tensors.
constexpr const char* kCertifiedConfigFiles[] = {"config.json", "quantize_config.json", "quant_config.json",
                                                  "model.safetensors.index.json"};

std::string fmt_double(double v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.3g", v);
  return buf;
}

CheckResult check_structure(const ModuleDesc& d, const FormatInfo& fi, const QuantizedLinear& q) {
  CheckResult c{"structure", true, ""};
  auto fail = [&](const std::string& why) {
    if (c.ok) c.detail = why; else c.detail += "; " + why;
    c.ok = false;
  };
  // A module may follow one of the config's per-module schemes (GPTQModel `dynamic`, further
  // compressed-tensors config_groups) instead of the checkpoint-wide values.
  if (fi.bits && fi.bits != d.bits && !fi.other_bits.count(d.bits))
    fail("config says bits " + std::to_string(fi.bits) + " but the tensors hold " + std::to_string(d.bits) + "-bit codes");
  auto group_fits = [&](int g) { return g == d.group_size || (d.groups == 1 && (g == -1 || g == d.k)); };
  if (fi.group_size && !group_fits(fi.group_size) &&
      std::none_of(fi.other_groups.begin(), fi.other_groups.end(), group_fits))
    fail("config says group_size " + std::to_string(fi.group_size) + " but the scales have " + std::to_string(d.groups) +
         " rows for k = " + std::to_string(d.k) + " (group size " + std::to_string(d.group_size) + ")");
  // An asymmetric config may hold a module whose zero points all happen to be 2^(bits-1); the reverse
  // (sym=true over real zero points) makes loaders that trust the config drop them.
  if (fi.sym && !d.sym && fi.format != Format::Awq)
    fail(std::string("config says sym=") + (fi.sym ? "true" : "false") + " but the zero points are " +
         (d.sym ? "symmetric" : "asymmetric"));
  // vLLM and compressed-tensors use g_idx only when the config says act-order (desc_act / actorder).
  if (d.act_order && !fi.desc_act)
    fail("config says no act-order (desc_act / actorder) but g_idx is not k // group_size: loaders would ignore it");
  // GPTQ's act-order assigns groups by position in its order: exactly group_size rows each.
  if (!q.g_idx.empty() && q.group_size > 0 && q.k % q.group_size == 0) {
    std::vector<int64_t> rows(size_t(q.groups()), 0);
    for (int32_t g : q.g_idx) rows[size_t(g)]++;  // validate() bounds every entry
    for (size_t g = 0; g < rows.size(); ++g)
      if (rows[g] != q.group_size) {
        fail("g_idx gives group " + std::to_string(g) + " " + std::to_string(rows[g]) + " rows, not group_size " +
             std::to_string(q.group_size) + " (act-order puts exactly group_size rows in every group)");
        break;
      }
  }
  for (size_t i = 0; i < q.scales.size(); ++i) {
    float s = word16_to_float(q.scales[i], q.scale_type == ScaleType::BF16);
    // Every quantizer of these formats derives scales from a range (2·absmax or max − min): positive. A
    // negative one flips the sign of its group's weights.
    if (!std::isfinite(s) || s <= 0.f) {
      fail("scale at group " + std::to_string(i / size_t(q.n)) + ", column " + std::to_string(i % size_t(q.n)) +
           " is " + (s == 0.f ? "zero" : s < 0.f ? "negative" : "not finite"));
      break;
    }
  }
  return c;
}

// Unpack -> repack must give back the stored bytes exactly, tensor by tensor.
CheckResult check_layout(const Checkpoint& ck, const ModuleDesc& d, const QuantizedLinear& q) {
  auto target = writer_for(d.format);
  if (!target) return {"layout", true, "not re-packed: no writer for " + format_name(d.format)};
  // Sparse-Marlin: the positions the file recorded (a kept zero may sit at either of two places).
  ModuleLayout layout;
  layout.recorded_24_positions = true;
  std::vector<PackedTensor> packed = write_module(*target, q, layout);
  for (const PackedTensor& t : packed) {
    // Sparse-Marlin files may use the original packer's names (`meta`, `s_24`); the bytes are the same.
    auto ref = ck.find(d.format == Format::Marlin24 ? marlin24_stored_name(ck, t.spec.name) : t.spec.name);
    if (!ref) return {"layout", false, "re-packing produces " + t.spec.name + ", which the checkpoint lacks"};
    std::span<const uint8_t> stored = ref->file->data(*ref->info);
    if (stored.size() != t.bytes.size())
      return {"layout", false, t.spec.name + ": stored " + std::to_string(stored.size()) + " bytes, re-packed " +
                                   std::to_string(t.bytes.size())};
    auto mis = std::mismatch(stored.begin(), stored.end(), t.bytes.begin());
    if (mis.first != stored.end())
      return {"layout", false, t.spec.name + ": re-packed bytes differ from the stored ones first at byte " +
                                   std::to_string(mis.first - stored.begin()) +
                                   " (the packed weights do not follow the layout)"};
  }
  return {"layout", true, "re-packed " + std::to_string(packed.size()) + " tensors byte-identical"};
}

void check_arithmetic(LayerReport& L, const QuantizedLinear& q, const VerifyOptions& opt, bool gpu) {
  const bool bf16 = bf16_kernel(q);
  const double gate = std::max(L.sparse24 ? opt.tol.arith_mean_rel_24 : opt.tol.arith_mean_rel_dense,
                               bf16 ? opt.tol.arith_mean_rel_bf16 : 0.0);
  CheckResult c{"arithmetic", true, ""};
  L.activations = bf16 ? "bf16" : "fp16";
  const size_t nb = opt.batch_sizes.size();
  std::vector<std::vector<uint16_t>> As(nb);  // [m_i, k] fp16 or bf16 (the layer's kernel) per batch
  for (size_t bi = 0; bi < nb; ++bi)
    As[bi] = random_activations(opt.batch_sizes[bi], q.k, opt.seed * 1000003ULL + bi, bf16);
  // GPU: every batch through the kernel and every column against a float64 reference, in one call.
  std::vector<float> got_all;
  std::vector<double> ref_all;
  bool on_gpu = false;
  if (gpu) {
    std::vector<uint16_t> stacked;
    for (const auto& a : As) stacked.insert(stacked.end(), a.begin(), a.end());
    std::string why;
    on_gpu = gpu_arith(L.name, q, stacked, opt.batch_sizes, got_all, ref_all, why);
  }
  const std::vector<int64_t> cols = sample_columns(q.n, on_gpu ? q.n : kCpuMaxColumns);
  size_t row = 0;
  for (size_t bi = 0; bi < nb; ++bi) {
    const int m = opt.batch_sizes[bi];
    std::vector<float> got;
    std::vector<double> ref;
    if (on_gpu) {
      const size_t off = row * size_t(q.n), len = size_t(m) * size_t(q.n);
      got.assign(got_all.begin() + std::ptrdiff_t(off), got_all.begin() + std::ptrdiff_t(off + len));
      ref.assign(ref_all.begin() + std::ptrdiff_t(off), ref_all.begin() + std::ptrdiff_t(off + len));
    } else {
      ref = gemm_reference(As[bi], m, q, cols);
      got = gemm_kernel_numerics(As[bi], m, q, cols);
    }
    row += size_t(m);
    RelErr e = compare(got, ref);
    L.arith.push_back({m, e.mean_rel, e.max_rel, e.finite});
    if (!e.finite || !(e.mean_rel <= gate)) {
      c.ok = false;
      c.detail = "m=" + std::to_string(m) + ": " +
                 (e.finite ? "mean relative error " + fmt_double(e.mean_rel) + " > " + fmt_double(gate)
                           : std::string("non-finite outputs (fp16 overflow?)"));
    }
  }
  if (c.ok) {
    double worst = 0;
    for (auto& a : L.arith) worst = std::max(worst, a.mean_rel_err);
    c.detail = "worst mean relative error " + fmt_double(worst) + " over m in {" ;
    for (size_t i = 0; i < nb; ++i) c.detail += (i ? "," : "") + std::to_string(opt.batch_sizes[i]);
    c.detail += "}, " + L.activations + " activations" +
                (on_gpu ? std::string(L.sparse24 ? ", dense Marlin kernel on the GPU (2:4: pruned weights as zeros)"
                                                 : ", Marlin kernel on the GPU") + ", every column"
                        : ", CPU kernel numerics, " + std::to_string(cols.size()) + " of " + std::to_string(q.n) +
                              " columns");
  }
  L.checks.push_back(c);
}

// The kept weights of a layer a dense format stores 2:4-pruned (GPTQ + SparseGPT written as gptq, marlin
// or compressed-tensors): when every aligned 4 weights along k of every column hold at least two zeros
// (wq [k, n] dequantized), the non-zero ones, [k, n]; else empty (a dense layer).
std::vector<uint8_t> kept_of_24_pattern(const std::vector<float>& wq, int64_t k, int64_t n) {
  if (k % 4 != 0) return {};
  for (int64_t g = 0; g < k / 4; ++g)
    for (int64_t c = 0; c < n; ++c) {
      int zeros = 0;
      for (int t = 0; t < 4; ++t) zeros += wq[size_t((4 * g + t) * n + c)] == 0.0f;
      if (zeros < 2) return {};
    }
  std::vector<uint8_t> kept(wq.size());
  for (size_t i = 0; i < wq.size(); ++i) kept[i] = wq[i] != 0.0f;
  return kept;
}

// Against the original weights: the whole-layer error against a naive round-to-nearest's on the same
// scheme, the stored scales against the original groups' min-max scales, per-column errors, and in
// layers that round to nearest each weight's distance in steps.
void check_reference(LayerReport& L, const QuantizedLinear& q, const Checkpoint& ref, const VerifyOptions& opt) {
  const std::string wname = L.name + ".weight";
  auto r = ref.find(wname);
  if (!r) { L.checks.push_back({"reference", false, "reference checkpoint has no " + wname}); return; }
  const auto& shape = r->info->shape;
  if (shape.size() != 2 || shape[0] != q.n || shape[1] != q.k) {
    L.checks.push_back({"reference", false, wname + " has shape other than [n=" + std::to_string(q.n) +
                                                ", k=" + std::to_string(q.k) + "]"});
    return;
  }
  const DType rdt = r->info->dtype;
  if (rdt != DType::F16 && rdt != DType::BF16 && rdt != DType::F32 && rdt != DType::F64) {
    L.checks.push_back({"reference", false, wname + " is " + std::string(dtype_name(r->info->dtype)) +
                                                ", not a floating-point weight"});
    return;
  }
  std::vector<float> w = to_float(r->file->data(*r->info), r->info->dtype);  // [n, k]
  // A NaN or Inf in the reference would make every error below NaN (reported as 0 or passing).
  if (auto bad = std::find_if(w.begin(), w.end(), [](float x) { return !std::isfinite(x); }); bad != w.end()) {
    const size_t i = size_t(bad - w.begin());
    L.checks.push_back({"reference", false, wname + "[" + std::to_string(i / size_t(q.k)) + ", " +
                                                std::to_string(i % size_t(q.k)) + "] is not finite: no reference"});
    return;
  }
  const std::vector<float> wq = dequantize(q);                               // [k, n]
  // A 2:4 layer in a dense format is measured as one: against a 2:4 naive quantizer, its zeros taken as
  // pruned (a kept weight that rounded to zero is then left out too: it is within half a step).
  const std::vector<uint8_t> pattern = q.mask.empty() ? kept_of_24_pattern(wq, q.k, q.n) : std::vector<uint8_t>();
  const bool dense_24 = !pattern.empty();
  const std::vector<uint8_t>& kept = dense_24 ? pattern : q.mask;  // [k, n] or empty
  // Whole-layer error, the worst single weight in quantization steps (a flipped code bit or a wrong
  // scale shows there), and per-column errors (swapped scale columns show there).
  double dw = 0, nw = 0, worst_steps = 0;
  int64_t worst_r = 0, worst_c = 0;
  std::vector<double> col_err(size_t(q.n));
  StepHistogram hist;
  for (int64_t c = 0; c < q.n; ++c) {
    double dc = 0, nc = 0;
    for (int64_t k = 0; k < q.k; ++k) {
      double a = w[size_t(c * q.k + k)], b = wq[size_t(k * q.n + c)];
      dc += (a - b) * (a - b); nc += a * a;
      if (!kept.empty() && !kept[size_t(k * q.n + c)]) continue;  // pruned: the original is not kept
      double steps = std::fabs(a - b) / std::fabs(double(q.scale_of(k, c)));
      hist.add(steps);
      if (steps > worst_steps) { worst_steps = steps; worst_r = k; worst_c = c; }
    }
    col_err[size_t(c)] = nc > 0 ? std::sqrt(dc / nc) : 0;
    dw += dc; nw += nc;
  }
  std::vector<double> sorted_cols = col_err;
  std::nth_element(sorted_cols.begin(), sorted_cols.begin() + q.n / 2, sorted_cols.end());
  const double col_median = sorted_cols[size_t(q.n / 2)];
  int64_t worst_col = std::max_element(col_err.begin(), col_err.end()) - col_err.begin();
  L.weight_rel_err = nw > 0 ? std::sqrt(dw / nw) : 0;
  L.naive_rel_err = naive_rtn_error(w.data(), q.n, q.k, {q.bits, q.group_size, q.sym, !kept.empty()});
  L.scale_ratio = median_scale_ratio(w.data(), q, kept);
  L.far_fraction = hist.fraction_above(kNearStep);
  const bool nearest = L.far_fraction <= kRtnMaxFarFraction;
  std::string problems;
  auto add = [&](const std::string& p) { problems += (problems.empty() ? "" : "; ") + p; };
  if (worst_steps > kMaxStepError && nearest)
    add("weight (" + std::to_string(worst_r) + ", " + std::to_string(worst_c) + ") is " + fmt_double(worst_steps) +
        " quantization steps from the reference (more than " + fmt_double(kMaxStepError) + ")");
  if (L.naive_rel_err > 0 && L.weight_rel_err > opt.tol.max_error_vs_naive * L.naive_rel_err)
    add("weight error " + fmt_double(L.weight_rel_err) + " is " + fmt_double(L.weight_rel_err / L.naive_rel_err) +
        "x a naive round-to-nearest's on the same scheme (" + fmt_double(L.naive_rel_err) + "; at most " +
        fmt_double(opt.tol.max_error_vs_naive) + "x)");
  if (L.scale_ratio > 0 && (L.scale_ratio < opt.tol.scale_ratio_min || L.scale_ratio > opt.tol.scale_ratio_max))
    add("the scales are " + fmt_double(L.scale_ratio) + "x the min-max scales of the original weights' groups (median; " +
        fmt_double(opt.tol.scale_ratio_min) + "-" + fmt_double(opt.tol.scale_ratio_max) + " expected)");
  if (col_err[size_t(worst_col)] > kOutlierFloor && col_err[size_t(worst_col)] > opt.tol.outlier_factor * col_median)
    add("output column " + std::to_string(worst_col) + " has error " + fmt_double(col_err[size_t(worst_col)]) + ", " +
        fmt_double(col_err[size_t(worst_col)] / col_median) + "x the layer's median column (scales or codes of that column are wrong)");
  std::vector<uint16_t> A = random_activations(kReferenceRows, q.k, opt.seed + 7);
  std::vector<float> a(A.size());
  half_to_float_n(A.data(), a.data(), A.size());
  // Per-column sums, added in column order afterwards: the result does not depend on the thread count
  // or schedule (an OpenMP reduction would add in whatever order threads finish).
  std::vector<double> dyc(size_t(q.n)), nyc(size_t(q.n));
#pragma omp parallel for schedule(dynamic)
  for (long long c = 0; c < q.n; ++c)
    for (int i = 0; i < kReferenceRows; ++i) {
      double y = 0, yq = 0;
      for (int64_t k = 0; k < q.k; ++k) {
        double x = a[size_t(i) * size_t(q.k) + size_t(k)];
        y += x * w[size_t(c * q.k + k)];
        yq += x * wq[size_t(k * q.n + c)];
      }
      dyc[size_t(c)] += (y - yq) * (y - yq); nyc[size_t(c)] += y * y;
    }
  double dy = 0, ny = 0;
  for (int64_t c = 0; c < q.n; ++c) dy += dyc[size_t(c)], ny += nyc[size_t(c)];
  L.output_rel_err = ny > 0 ? std::sqrt(dy / ny) : 0;
  char far[32];
  std::snprintf(far, sizeof far, "%.1f%%", 100 * L.far_fraction);
  // A reference of zeros has no naive error to compare with (nor any error of its own).
  const std::string vs_naive = L.naive_rel_err > 0 ? fmt_double(L.weight_rel_err / L.naive_rel_err) + "x" : "-";
  std::string summary = "weight error " + fmt_double(L.weight_rel_err) + " (" + vs_naive +
                        " naive round-to-nearest), output error " + fmt_double(L.output_rel_err) + ", scales " +
                        fmt_double(L.scale_ratio) + "x min-max, worst weight " + fmt_double(worst_steps) + " steps, " + far +
                        " beyond " + fmt_double(kNearStep) + (nearest ? " (round to nearest)" : " (error feedback: steps not gated)") +
                        (dense_24 ? "; 2:4 pattern in a dense format, measured as 2:4" : "");
  L.checks.push_back({"reference", problems.empty(), problems.empty() ? summary : problems + " (" + summary + ")"});
}

// A layer far above the median of its peers (same module kind, e.g. all q_proj) is the usual sign of
// a broken conversion even when every other check passes.
void flag_outliers(std::vector<LayerReport>& layers, double factor) {
  std::map<std::string, std::vector<double>> by_kind;
  std::vector<double> all;
  for (auto& L : layers)
    if (L.output_rel_err >= 0) { by_kind[split_tensor_name(L.name).leaf].push_back(L.output_rel_err); all.push_back(L.output_rel_err); }
  auto median = [](std::vector<double> v) {
    std::sort(v.begin(), v.end());
    return v.empty() ? 0.0 : v[v.size() / 2];
  };
  const double overall = median(all);
  for (auto& L : layers) {
    if (L.output_rel_err < 0) continue;
    const auto& peers = by_kind[split_tensor_name(L.name).leaf];
    const double med = peers.size() >= 3 ? median(peers) : overall;
    if (L.output_rel_err > kOutlierFloor && L.output_rel_err > factor * med) {
      L.outlier = true;
      for (auto& c : L.checks)
        if (c.name == "reference") {
          c.ok = false;
          c.detail += "; outlier: " + fmt_double(L.output_rel_err / med) + "x the median output error of its peers (" +
                      fmt_double(med) + ")";
        }
    }
  }
}

std::string utc_now() {
  std::time_t t = std::time(nullptr);
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%SZ", std::gmtime(&t));
  return buf;
}

}  // namespace

bool LayerReport::ok() const {
  return std::all_of(checks.begin(), checks.end(), [](const CheckResult& c) { return c.ok; });
}

bool VerifyReport::ok() const {
  return global_problems.empty() && !layers.empty() &&
         std::all_of(layers.begin(), layers.end(), [](const LayerReport& l) { return l.ok(); });
}

VerifyReport verify_checkpoint(const std::filesystem::path& dir, const VerifyOptions& opt, const LayerCallback& on_layer) {
  Checkpoint ck = Checkpoint::open(dir);
  std::optional<Checkpoint> ref;
  if (opt.reference) ref.emplace(Checkpoint::open(*opt.reference));
  FormatInfo fi = detect_format(ck);
  VerifyReport rep;
  rep.checkpoint = ck.source().string();
  rep.format = format_name(fi.format);
  rep.format_notes = fi.notes;
  rep.tol = opt.tol;
  rep.seed = opt.seed;
  if (opt.reference) rep.reference = opt.reference->string();
  std::string gpu_name;
  const bool gpu = !opt.force_cpu && gpu_available(gpu_name);
  rep.backend = gpu ? "cuda:" + gpu_name : "cpu (kernel-emulating reference GEMM)";

  // The files' hashes on a thread of their own, beside the per-layer work (which reads the same
  // bytes through the mmap, so the page cache serves both).
  auto file_hashes = std::async(std::launch::async, [&ck] {
    std::vector<std::pair<std::string, std::string>> v;
    for (const auto& f : ck.files()) v.emplace_back(f.path().filename().string(), sha256_file(f.path()));
    for (const char* extra : kCertifiedConfigFiles)
      if (std::filesystem::is_regular_file(ck.dir() / extra)) v.emplace_back(extra, sha256_file(ck.dir() / extra));
    std::sort(v.begin(), v.end());
    return v;
  });
  auto finish = [&]() -> VerifyReport {
    rep.files = file_hashes.get();
    return std::move(rep);
  };

  // detect_format's notes that say the config and the data disagree are failures here: a loader
  // trusting the label would compute wrong weights. The others (assumed defaults, act-order) inform.
  for (const auto& note : fi.notes)
    if (note.rfind("config key ", 0) == 0) rep.global_problems.push_back("malformed quantization config: " + note);
  for (const auto& note : fi.notes)
    for (const char* marker : {" but ", "disagrees", "lacks the companion", "differs from", "not uniformly"})
      if (note.find(marker) != std::string::npos) {
        rep.global_problems.push_back("config and data disagree: " + note);
        break;
      }
  if (fi.format == Format::Plain) {
    rep.global_problems.push_back("no quantized layers: the checkpoint holds plain weights");
    return finish();
  }
  // A directory is a checkpoint to load (a bare file, such as the original packers' outputs, is tensors only).
  std::error_code ec;
  if (ck.quantize_config().empty() && std::filesystem::is_directory(ck.source(), ec))
    rep.global_problems.push_back("no quantization config (config.json quantization_config, quantize_config.json or "
                                  "quant_config.json): loaders cannot tell how to read the quantized tensors");
  // Without an index, vLLM loads every *.safetensors of the directory; Checkpoint reads model.safetensors.
  if (!ck.sharded() && std::filesystem::is_directory(ck.source(), ec))
    for (std::filesystem::directory_iterator it(ck.dir(), ec), end; !ec && it != end; it.increment(ec))
      if (const auto& e = *it; e.path().extension() == ".safetensors" &&
          std::none_of(ck.files().begin(), ck.files().end(), [&](const auto& f) { return f.path() == e.path(); }))
        rep.global_problems.push_back("stray file " + e.path().filename().string() +
                                      " beside " + ck.files().front().path().filename().string() +
                                      ": not part of the checkpoint, but loaders that read every *.safetensors of a "
                                      "directory without an index load it too");
  // Each module described on its own: one that cannot be (a g_idx out of range, a wrong dtype) fails
  // as a layer and does not hide the others.
  std::vector<ModuleDesc> mods;
  std::vector<std::pair<std::string, std::string>> undescribed;  // prefix, why
  std::set<std::string> owned;
  for (const auto& p : quantized_modules(ck, fi.format)) {
    try {
      ModuleDesc d = describe_module(ck, p, fi);
      check_module_neighbours(ck, d);
      mods.push_back(std::move(d));
      owned.insert(mods.back().tensors.begin(), mods.back().tensors.end());
    } catch (const Error& e) {
      undescribed.emplace_back(p, e.what());
      for (const auto& name : ck.tensor_names())
        if (name.rfind(p + ".", 0) == 0) owned.insert(name);
    }
  }
  for (const auto& name : ck.tensor_names())
    if (!owned.count(name) && is_quant_leaf(name, true))  // a leftover: reported, the short names included
      rep.global_problems.push_back("unexpected tensor " + name + ": it looks quantized but belongs to no complete module");
  if (ref) {
    std::set<std::string> prefixes;
    for (const auto& d : mods) prefixes.insert(d.prefix);
    for (const auto& u : undescribed) prefixes.insert(u.first);
    for (auto& p : check_reference_tensors(ck, *ref, prefixes)) rep.global_problems.push_back(std::move(p));
  }
  for (const auto& [p, why] : undescribed) {
    LayerReport L;
    L.name = p;
    L.checks.push_back({"structure", false, why});
    rep.layers.push_back(std::move(L));
    if (on_layer) on_layer(rep.layers.back(), rep.layers.size() - 1, mods.size() + undescribed.size());
  }

  for (size_t i = 0; i < mods.size(); ++i) {
    const ModuleDesc& d = mods[i];
    auto t0 = std::chrono::steady_clock::now();
    LayerReport L;
    L.name = d.prefix; L.k = d.k; L.n = d.n; L.bits = d.bits; L.group_size = d.group_size;
    L.sparse24 = d.sparse24 || is_sparse(d.format); L.act_order = d.act_order;
    for (const auto& t : d.tensors) L.tensor_sha256.emplace_back(t, sha256_hex(ck.data(t)));
    std::optional<QuantizedLinear> q;
    try {
      q = read_module(ck, d, fi);
      q->validate();
    } catch (const Error& e) {
      L.checks.push_back({"structure", false, e.what()});
    }
    if (q) {
      L.checks.push_back(check_structure(d, fi, *q));
      try {
        L.checks.push_back(check_layout(ck, d, *q));
      } catch (const Error& e) {
        L.checks.push_back({"layout", false, e.what()});
      }
      check_arithmetic(L, *q, opt, gpu);
      if (ref) check_reference(L, *q, *ref, opt);
    }
    L.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    rep.layers.push_back(std::move(L));
    if (on_layer) on_layer(rep.layers.back(), rep.layers.size() - 1, mods.size() + undescribed.size());
  }
  std::stable_sort(rep.layers.begin(), rep.layers.end(),
                   [](const LayerReport& a, const LayerReport& b) { return a.name < b.name; });
  if (ref) flag_outliers(rep.layers, opt.tol.outlier_factor);
  return finish();
}

nlohmann::json VerifyReport::certificate() const {
  using nlohmann::json;
  json j;
  j["tool"] = {{"name", "marlinc"}, {"version", MARLINC_VERSION},
#ifdef MARLINC_HAVE_CUDA
               {"cuda", true},
#else
               {"cuda", false},
#endif
               {"cuda_architectures", MARLINC_CUDA_ARCHS}};
  j["date"] = utc_now();
  j["backend"] = backend;
  j["checkpoint"] = {{"path", checkpoint}, {"format", format}, {"format_notes", format_notes}};
  json files_j = json::array();
  for (auto& [name, h] : files) files_j.push_back({{"name", name}, {"sha256", h}});
  j["checkpoint"]["files"] = files_j;
  j["options"] = {{"seed", seed}, {"reference", reference.empty() ? json(nullptr) : json(reference)}};
  j["tolerances"] = {{"arith_mean_rel_dense", tol.arith_mean_rel_dense}, {"arith_mean_rel_24", tol.arith_mean_rel_24},
                     {"arith_mean_rel_bf16", tol.arith_mean_rel_bf16},
                     {"outlier_factor", tol.outlier_factor}, {"max_error_vs_naive", tol.max_error_vs_naive},
                     {"scale_ratio_min", tol.scale_ratio_min}, {"scale_ratio_max", tol.scale_ratio_max},
                     {"max_step_error", kMaxStepError}, {"near_step", kNearStep}, {"rtn_max_far_fraction", kRtnMaxFarFraction},
                     {"cpu_max_columns", kCpuMaxColumns}};
  j["global_problems"] = global_problems;
  json layers_j = json::array();
  size_t passed = 0;
  for (const auto& L : layers) {
    json l = {{"name", L.name}, {"k", L.k}, {"n", L.n}, {"bits", L.bits}, {"group_size", L.group_size},
              {"sparse24", L.sparse24}, {"act_order", L.act_order}, {"ok", L.ok()}, {"seconds", L.seconds}};
    json tensors = json::object();
    for (auto& [name, h] : L.tensor_sha256) tensors[name] = h;
    l["tensors_sha256"] = tensors;
    json checks = json::array();
    for (auto& c : L.checks) checks.push_back({{"check", c.name}, {"ok", c.ok}, {"detail", c.detail}});
    l["checks"] = checks;
    json arith = json::array();
    for (auto& a : L.arith)
      arith.push_back({{"m", a.m}, {"mean_rel_err", a.mean_rel_err}, {"max_rel_err", a.max_rel_err}, {"finite", a.finite}});
    l["arithmetic"] = arith;
    if (!L.activations.empty()) l["activations"] = L.activations;
    if (L.output_rel_err >= 0)
      l["reference"] = {{"weight_rel_err", L.weight_rel_err}, {"output_rel_err", L.output_rel_err},
                        {"naive_rel_err", L.naive_rel_err}, {"scale_ratio", L.scale_ratio},
                        {"far_fraction", L.far_fraction}, {"outlier", L.outlier}};
    passed += L.ok();
    layers_j.push_back(l);
  }
  j["layers"] = layers_j;
  j["summary"] = {{"layers", layers.size()}, {"passed", passed}, {"failed", layers.size() - passed}, {"ok", ok()}};
  return j;
}

std::vector<std::string> check_certificate(const std::filesystem::path& dir, const nlohmann::json& cert) {
  std::vector<std::string> problems;
  auto need = [&](const nlohmann::json& j, const char* key) -> const nlohmann::json& {
    if (!j.is_object() || !j.contains(key)) bad_data("certificate: missing key \"" + std::string(key) + "\"");
    return j.at(key);
  };
  auto need_str = [&](const nlohmann::json& j, const char* key) {
    const nlohmann::json& v = need(j, key);
    if (!v.is_string()) bad_data("certificate: \"" + std::string(key) + "\" is " + v.type_name() + ", not a string");
    return v.get<std::string>();
  };
  const auto& files = need(need(cert, "checkpoint"), "files");
  const auto& layers = need(cert, "layers");
  if (!files.is_array() || !layers.is_array()) bad_data("certificate: checkpoint.files and layers must be arrays");
  // A certificate of a failed verification certifies nothing, whatever the files hold now.
  const nlohmann::json& summary = need(cert, "summary");
  if (!need(summary, "ok").is_boolean()) bad_data("certificate: summary.ok is not true or false");
  if (!summary.at("ok").get<bool>()) problems.push_back("the certificate records a failed verification (summary.ok is false)");
  Checkpoint ck = Checkpoint::open(dir);
  std::set<std::string> certified_files;
  for (const auto& f : files) {
    const std::string name = need_str(f, "name"), want = need_str(f, "sha256");
    certified_files.insert(name);
    if (name.find('/') != std::string::npos || name.find("..") != std::string::npos)
      bad_data("certificate: file name \"" + name + "\" is not a plain file name");
    std::filesystem::path p = ck.dir() / name;
    if (!std::filesystem::exists(p)) { problems.push_back("file " + name + " is missing"); continue; }
    if (sha256_file(p) != want) problems.push_back("file " + name + " changed (SHA-256 differs)");
  }
  // A config file that appeared after certification changes how loaders read the tensors.
  for (const char* extra : kCertifiedConfigFiles)
    if (!certified_files.count(extra) && std::filesystem::is_regular_file(ck.dir() / extra))
      problems.push_back(std::string("file ") + extra + " was added after certification");
  std::set<std::string> listed;
  for (const auto& l : layers) {
    const std::string lname = need_str(l, "name");
    listed.insert(lname);
    for (const auto& [tname, h] : need(l, "tensors_sha256").items()) {
      if (!h.is_string()) bad_data("certificate: " + lname + ": the hash of " + tname + " is not a string");
      auto r = ck.find(tname);
      if (!r) { problems.push_back(lname + ": tensor " + tname + " is missing"); continue; }
      if (sha256_hex(r->file->data(*r->info)) != h.get<std::string>())
        problems.push_back(lname + ": tensor " + tname + " changed (its bytes differ from the certified ones)");
    }
  }
  FormatInfo fi = detect_format(ck);
  for (const auto& d : describe_modules(ck, fi))
    if (!listed.count(d.prefix)) problems.push_back("layer " + d.prefix + " is not in the certificate");
  return problems;
}

}  // namespace marlinc
