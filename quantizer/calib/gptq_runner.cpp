#include "quantizer/calib/gptq_runner.h"


#include <algorithm>
#include <charconv>
#include <chrono>
#include <cmath>
#include <map>
#include <numeric>
#include <set>
#include <exception>
#include <random>
#include <thread>
#include <utility>

#include "checkpoint/convert_dtype.h"
#include "checkpoint/error.h"
#include "checkpoint/writer.h"
#include "quantizer/calib/calib_pass.h"
#include "quantizer/calib/forward_cuda.h"
#include "quantizer/calib/gpu_calib.h"
#include "quantizer/calib/job_file.h"
#include "quantizer/calib/tokenizer.h"
#include "quantizer/rtn.h"
#ifdef MARLINC_HAVE_CUDA
#include "quantizer/gptq_cuda.cuh"
#endif

namespace marlinc::calib {

namespace {

// The double nearest the float's shortest decimal form: the record says "damp": 0.01, not the float's
// exact 0.009999999776482582.
double float_as_decimal(float v) {
  char buf[32];
  const auto r = std::to_chars(buf, buf + sizeof buf, v);
  double d = 0;
  std::from_chars(buf, r.ptr, d);
  return d;
}

using Clock = std::chrono::steady_clock;
double since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

// The built-in default loads every block to generate, so it is for small models only.
constexpr double kMaxGenerateModelBytes = 2e9;

std::string mb(double bytes) { return std::to_string(int64_t(std::llround(bytes / 1e6))) + " MB"; }

constexpr LinearInput kGroups[] = {LinearInput::QKV, LinearInput::O, LinearInput::GateUp, LinearInput::Down};

// The CPU pass's peak (calib_pass.cpp): hidden states, one block in fp32 (twice: the checkpoint's and the
// working copy), its Hessians (fp32 [k, k]: four, or an MoE block's two per expert), and the linear inputs
// captured for one chunk of samples (`chunk_tokens`: the longest chunk's tokens; an MoE block captures each
// token once per chosen expert, or under ExpertCalibration::All once per expert). The checkpoint itself is
// mapped, not counted.
double peak_estimate(const LlamaConfig& c, size_t tokens, size_t chunk_tokens, ExpertCalibration ec) {
  const double qd = double(c.heads * c.head_dim), kvd = double(c.kv_heads * c.head_dim), h = double(c.hidden);
  const double attn = 4.0 * (h * qd * 2 + h * kvd * 2), attn_hess = 4.0 * (h * h + qd * qd);
  double mlp = 0, mlp_hess = 0, captured = 0;  // the largest block's, and per token
  for (int64_t b = 0; b < c.layers; ++b) {
    double m = 0, mh = 0, per_token = h + qd;  // the attention's inputs
    if (c.layer_moe(b)) {
      const double E = double(c.moe.experts), f = double(c.moe.expert_intermediate),
                   s = double(c.moe.shared_intermediate);
      m = 4.0 * (E * 3 * h * f + 3 * h * s + E * h);
      mh = 4.0 * (E * (h * h + f * f) + (s > 0 ? h * h + s * s : 0));
      // Routed: each token once per chosen expert; All: once for every expert's gate/up, and every expert's down.
      per_token += (ec == ExpertCalibration::All ? h + E * f : double(c.moe.top_k) * (h + f)) + (s > 0 ? h + s : 0);
    } else {
      const double f = double(c.intermediate);
      m = 4.0 * 3 * h * f;
      mh = 4.0 * (h * h + f * f);
      per_token += h + f;
    }
    mlp = std::max(mlp, m);
    mlp_hess = std::max(mlp_hess, mh);
    captured = std::max(captured, per_token);
  }
  return 4.0 * double(tokens) * h + (attn + mlp) * 2 + attn_hess + mlp_hess + 4.0 * double(chunk_tokens) * captured;
}


// Puts a block that an interrupted run finished back (job_file.h): its saved results are written in
// the order a fresh run writes them and reported as they were, and their dequantized weights go into
// the pass's block, so the forward pass after it gives the next block the inputs the uninterrupted
// run gave it.
void replay_block(const GptqJob& job, int64_t b, const QuantPlan& P, const QuantizeOptions& qo, CheckpointWriter& w,
                  QuantizeReport& rep, CalibPass& pass, const LlamaConfig& c,
                  const std::function<void(size_t, const QuantizedLayerReport&)>& report) {
  std::vector<FinishedLayer> saved = job.load_block(b);
  const std::string file = job.block_file(b).string();
  // What a fresh run produces for this block, in its order: the planned modules, group by group (a
  // fused module once, with the linears it holds).
  std::vector<std::pair<std::vector<LinearRef>, size_t>> expected;  // (linears, index into P.jobs)
  for (LinearInput g : kGroups)
    for (LinearRef l : block_linears(c, b, g)) {
      const auto it = P.job_of_tensor.find(linear_source(c, b, l).prefix + ".weight");
      if (it == P.job_of_tensor.end()) continue;
      if (!expected.empty() && expected.back().second == it->second) expected.back().first.push_back(l);
      else expected.push_back({{l}, it->second});
    }
  if (saved.size() != expected.size())
    bad_data(file + ": holds " + std::to_string(saved.size()) + " layers, but this run quantizes " +
             std::to_string(expected.size()) + " in block " + std::to_string(b));
  for (size_t i = 0; i < saved.size(); ++i) {
    const auto& [ls, j] = expected[i];
    const QuantJob& qj = P.jobs[j];
    FinishedLayer& f = saved[i];
    if (f.q.name != qj.prefix || f.q.n != qj.desc.n || f.q.k != qj.desc.k)
      bad_data(file + ": layer " + std::to_string(i) + " is " + f.q.name + " [" + std::to_string(f.q.n) + ", " +
               std::to_string(f.q.k) + "], expected " + qj.prefix + " [" + std::to_string(qj.desc.n) + ", " +
               std::to_string(qj.desc.k) + "]");
    const QuantizedLinear q = write_quantized(w, qo, qj, std::move(f.q), rep);
    for (LinearRef l : ls) {
      const LinearSource s = linear_source(c, b, l);
      pass.set_weight(l, s.fused() ? slice_n(q, s.row0, s.rows) : q);
    }
    report(j, f.report);
  }
}

// Saves finished blocks to the job on a background thread, one at a time and in order, so that
// encoding, writing and fsyncing a block file overlaps the next block's work. A block is in the job
// only once its save returned; a kill before that means it is computed again on resume.
class BlockSaver {
 public:
  explicit BlockSaver(GptqJob& job) : job_(job) {}
  BlockSaver(const BlockSaver&) = delete;
  BlockSaver& operator=(const BlockSaver&) = delete;
  ~BlockSaver() {
    if (t_.joinable()) t_.join();
  }
  // Waits for the save in flight; rethrows its error.
  void wait() {
    if (t_.joinable()) t_.join();
    if (err_) std::rethrow_exception(std::exchange(err_, nullptr));
  }
  void save(int64_t b, std::vector<FinishedLayer> layers) {
    wait();
    t_ = std::thread([this, b, l = std::move(layers)] {
      try {
        job_.save_block(b, l);
      } catch (...) {
        err_ = std::current_exception();
      }
    });
  }

 private:
  GptqJob& job_;
  std::thread t_;
  std::exception_ptr err_;
};

std::string resume_hint(const std::filesystem::path& out) {
  return " (the finished blocks are kept in " + job_dir_for(out).string() +
         ": run the same command again to resume, or add --restart to start over)";
}

}  // namespace

std::vector<std::vector<int32_t>> generate_samples(const LlamaModel& model, int32_t bos, int32_t eos, size_t count,
                                                   size_t min_len, size_t max_len, uint64_t seed) {
  if (bos < 0) bad_usage("the built-in calibration needs a BOS token to start from; give --calib FILE");
  if (min_len < 2 || max_len < min_len) bad_usage("generated sample lengths need 2 <= min <= max");
  const LlamaConfig& c = model.config();
  std::vector<BlockWeights> blocks;
  for (int64_t b = 0; b < c.layers; ++b) blocks.push_back(model.load_block(b));
  // Samples are independent: each has its own generator (seed, sample index), so the result does not
  // depend on the thread count, and they run in parallel (no KV cache: each step is a full forward).
  std::vector<std::vector<int32_t>> gen(count);
#pragma omp parallel for schedule(dynamic, 1)
  for (long long s = 0; s < (long long)count; ++s) {
    std::mt19937_64 rng(seed * 0x9e3779b97f4a7c15ULL + uint64_t(s));
    const size_t len = min_len + size_t(uniform_below(rng, max_len - min_len + 1));
    std::vector<int32_t> ids = {bos};
    while (ids.size() < len) {
      const Matrix logits = model.forward(ids, blocks);  // [T, vocab]
      const auto row = logits.row(logits.rows() - 1);
      double mx = -INFINITY;
      for (int64_t v = 0; v < row.size(); ++v) mx = std::max(mx, double(row(v)));
      double total = 0;
      for (int64_t v = 0; v < row.size(); ++v) total += std::exp(double(row(v)) - mx);
      // u in [0, 1) from 53 bits: the same draw on every platform.
      double u = double(rng() >> 11) * 0x1.0p-53 * total;
      int32_t next = int32_t(row.size() - 1);
      for (int64_t v = 0; v < row.size(); ++v) {
        u -= std::exp(double(row(v)) - mx);
        if (u < 0) { next = int32_t(v); break; }
      }
      if (next == eos) break;
      ids.push_back(next);
    }
    gen[size_t(s)] = std::move(ids);
  }
  std::vector<std::vector<int32_t>> out;
  for (auto& ids : gen)
    if (ids.size() >= 2) out.push_back(std::move(ids));
  return out;
}

// The whole run; `resumable` turns true once a failure would leave a job worth resuming.
static QuantizeReport run_gptq(const std::filesystem::path& in, const std::filesystem::path& out,
                               const QuantizeOptions& qo, const GptqRunOptions& go, const LayerDone& on_layer,
                               const RunLog& log, GptqRunInfo* info, bool& resumable) {
  const auto t_start = Clock::now();
  auto say = [&](const std::string& s) { if (log) log(s); };
  GptqRunInfo I;
  const LlamaModel model = LlamaModel::open(in);
  const LlamaConfig& c = model.config();
  const Checkpoint& ck = model.checkpoint();
  check_output_not_input(ck.dir(), out);
  QuantizeReport rep;
  rep.input = ck.source().string();
  rep.output = out.string();
  rep.target = target_name(qo.to);
  rep.method = "gptq";
  const QuantPlan P = plan_quantization(ck, qo, rep);
  GptqOptions base = go.gptq;
  base.bits = qo.bits;
  base.group_size = qo.group_size;
  if (qo.to == TargetFormat::Marlin24) base.sparse24 = true;
  // Options every layer would refuse are refused before the calibration pass, not after it.
  if (!(base.damp >= 0.0f && base.damp < 1.0f))
    bad_usage("--damp " + std::to_string(base.damp) + ": the relative damping must be in [0, 1)");
#ifndef MARLINC_HAVE_CUDA
  if (base.device == GptqOptions::Device::Cuda)
    bad_usage("--device cuda: this marlinc was built without CUDA (configure with -DMARLINC_CUDA=ON)");
#endif
#ifdef MARLINC_HAVE_CUDA
  if (base.device == GptqOptions::Device::Cuda) require_cuda_device("--device cuda");
#endif
  if (base.sparse24 && base.order != GptqOptions::Natural)
    bad_usage("--sparsity 2:4 runs in natural column order (SparseGPT); drop --order or use --order natural");
  if (go.forward_on_cpu && base.device != GptqOptions::Device::Cuda)
    bad_usage("--forward-device cpu: GPTQ runs on the CPU already (--device cpu)");
  if (go.expert_calibration == ExpertCalibration::All && !c.has_moe())
    bad_usage("--expert-calibration all: " + c.architecture + " has no mixture-of-experts layer");

  // Calibration: the file, or samples the model writes itself.
  CalibSet cs;
  if (go.calib_file) {
    std::unique_ptr<Tokenizer> tok;
    // Token ids need no tokenizer (a model directory may have none): Auto is resolved first.
    if (resolve_calib_format(*go.calib_file, go.calib.format) != CalibFormat::Tokens) tok = load_tokenizer(ck.dir());
    cs = load_calibration(*go.calib_file, tok.get(), go.calib);
  } else {
    double model_bytes = 0;
    for (const auto& name : ck.tensor_names()) model_bytes += double(ck.data(name).size());
    if (model_bytes > kMaxGenerateModelBytes)
      bad_usage(rep.input + ": the built-in calibration (samples the model generates) is for small models; give "
                "--calib FILE with real text");
    say("calibration: none given, so the model generates " + std::to_string(go.generated_samples) +
        " samples itself (seed " + std::to_string(go.calib.seed) + "); real text (--calib FILE) calibrates better");
    // BOS/EOS from config.json (every HF model has them there); the tokenizer only when it lacks them.
    auto id_of = [&](const char* key) -> std::optional<int32_t> {
      const auto it = ck.config().find(key);
      if (it != ck.config().end() && it->is_number_integer()) return it->get<int32_t>();
      return std::nullopt;
    };
    std::optional<int32_t> bos = id_of("bos_token_id"), eos = id_of("eos_token_id");
    if (!bos) {
      std::unique_ptr<Tokenizer> tok = load_tokenizer(ck.dir());
      bos = tok->bos_id();
      if (!eos) eos = tok->eos_id();
    }
    cs.name = "generated-by-model";
    cs.format = "generated";
    cs.samples = generate_samples(model, *bos, eos.value_or(-1), go.generated_samples, go.generated_min_len,
                                  go.generated_max_len, go.calib.seed);
    for (const auto& s : cs.samples) cs.tokens += s.size();
    cs.requested = go.generated_samples;
    cs.seed = go.calib.seed;
    cs.min_len = go.generated_min_len;
    cs.max_len = go.generated_max_len;
  }
  if (cs.samples.empty()) bad_usage("calibration: no sample qualified (check --min-len/--max-len against the data)");
  I.calibration = cs.to_json();
  I.samples = cs.samples.size();
  I.tokens = cs.tokens;
  const bool on_gpu = base.device == GptqOptions::Device::Cuda;
  const bool gpu_forward = on_gpu && !go.forward_on_cpu;
  std::string need;
  std::vector<size_t> lengths;
  for (const auto& smp : cs.samples) lengths.push_back(smp.size());
  if (gpu_forward) {
#ifdef MARLINC_HAVE_CUDA
    I.estimated_device_bytes = CudaForward::device_bytes(gpu_dims(c), lengths);
    // The estimate decides nothing by itself (the output must not depend on what else holds the GPU): it warns.
    const double avail = available_device_bytes();
    if (I.estimated_device_bytes > avail)
      say("warning: the GPU pass needs about " + mb(I.estimated_device_bytes) + " and " + mb(avail) +
          " of GPU memory are free; if it runs out, --forward-device cpu keeps the forward pass and Hessians in host "
          "memory (GPTQ stays on the GPU), or use fewer or shorter samples");
    // GPTQ's own memory comes on top, for each linear quantized at once: the largest linear's tells.
    double gptq_bytes = 0;
    for (int64_t b = 0; b < c.layers; ++b)
      for (LinearInput g : kGroups)
        for (LinearRef r : block_linears(c, b, g)) {
          const LinearSource s = linear_source(c, b, r);
          gptq_bytes = std::max(gptq_bytes, gptq_cuda_device_bytes(s.rows, s.in));
        }
    need = mb(I.estimated_device_bytes) + " of GPU memory for the forward pass and Hessians, and " + mb(gptq_bytes) +
           " for each GPTQ (up to " + std::to_string(gpu_gptq_at_once(c)) + " at once, as the free memory allows)";
#endif
  } else {
    // The CPU pass captures a chunk of samples at a time: at worst the longest ones.
    std::sort(lengths.rbegin(), lengths.rend());
    const size_t chunk = std::min(lengths.size(), cpu_pass_chunk_samples());
    const size_t chunk_tokens = std::accumulate(lengths.begin(), lengths.begin() + ptrdiff_t(chunk), size_t(0));
    I.estimated_peak_bytes = peak_estimate(c, cs.tokens, chunk_tokens, go.expert_calibration);
    need = mb(I.estimated_peak_bytes) + " of memory" + (on_gpu ? " (GPTQ on the GPU)" : "");
  }
  say("calibration: " + std::to_string(I.samples) + " samples, " + std::to_string(I.tokens) + " tokens (" + cs.name +
      "); needs about " + need);

  // An interrupted run with the same inputs left its finished blocks beside the output (job_file.h).
  const std::filesystem::path job_dir = job_dir_for(out);
  if (go.restart && discard_job(job_dir)) say("--restart: discarded the unfinished job in " + job_dir.string());
  GptqJob resume = GptqJob::open(job_dir, job_inputs(ck, qo, base, go.true_sequential, go.forward_on_cpu, go.expert_calibration, cs), c.layers);
  const int64_t resumed = resume.finished_blocks();
  I.resumed_blocks = resumed;
  if (resumed > 0)
    say("resuming: " + (resumed == 1 ? std::string("block 1") : "blocks 1.." + std::to_string(resumed)) + " of " +
        std::to_string(c.layers) + " finished, from " + job_dir.string());

  WriterOptions wo;
  wo.max_shard_bytes = qo.max_shard_bytes;
  wo.overwrite = qo.overwrite;
  CheckpointWriter w(out, P.specs, wo);
  auto t_io = Clock::now();
  for (const auto& name : ck.tensor_names()) {
    std::span<const uint8_t> bytes = ck.data(name);
    rep.bytes_in += bytes.size();
    if (!P.job_of_tensor.count(name)) {
      w.write(name, bytes);
      rep.bytes_out += bytes.size();
    }
  }
  I.seconds_io += since(t_io);

  std::vector<bool> done(P.jobs.size(), false);
  auto report = [&](size_t job, const QuantizedLayerReport& lr) {
    done[job] = true;
    rep.layers.push_back(lr);
    if (on_layer) on_layer(lr, rep.layers.size() - 1, P.jobs.size());
  };

  // The samples' embeddings become the first block's inputs inside the pass (CPU or GPU).
  std::unique_ptr<CalibPass> pass;
#ifdef MARLINC_HAVE_CUDA
  if (gpu_forward) pass = make_gpu_pass(model, cs.samples, go.expert_calibration);
#endif
  if (!pass) pass = make_cpu_pass(model, cs.samples, go.expert_calibration);

  BlockSaver saver(resume);
  double computed_s = 0;  // wall time of the blocks this run computed (not replayed)
  for (int64_t b = 0; b < c.layers; ++b) {
    const auto t_block = Clock::now();
    pass->load(b);
    std::vector<FinishedLayer> finished;  // this block's results as gptq_quantize gave them, for the job
    // Quantizes the linears of one input group with the Hessian of the last capture and gives the
    // pass their quantized weights, so the passes after it see the quantized block.
    const size_t reported_before = rep.layers.size();
    auto quantize_group = [&](LinearInput g) {
      std::vector<LinearRef> ls;
      std::vector<GptqOptions> os;
      std::vector<size_t> jobs;
      std::vector<bool> uncalibrated;  // an MoE expert no calibration token was routed to
      for (LinearRef l : block_linears(c, b, g)) {
        const LinearSource src = linear_source(c, b, l);
        auto it = P.job_of_tensor.find(src.prefix + ".weight");
        if (it == P.job_of_tensor.end()) continue;  // skipped by the plan: stays as it is
        ls.push_back(l);
        uncalibrated.push_back(pass->hessian_tokens(l) == 0);
        os.push_back(base);
        // A fused module's parts run GPTQ on their own rows (with the shared Hessian, rows are independent).
        os.back().name = src.prefix + (src.fused() ? " rows " + std::to_string(src.row0) + ".." +
                                                         std::to_string(src.row0 + src.rows - 1)
                                                   : std::string());
        os.back().bf16_scales = grid_bf16(qo, P.jobs[it->second]);
        jobs.push_back(it->second);
      }
      if (ls.empty()) return;
      std::vector<GptqStats> st;
      std::vector<QuantizedLinear> qs = pass->quantize_all(ls, os, st);
      for (size_t i = 0; i < ls.size(); ++i)
        if (uncalibrated[i]) st[i].loss = st[i].damp_used = -1;  // GPTQ with H = I (calib_pass.h): not calibrated
      for (size_t i0 = 0; i0 < ls.size();) {
        // The linears of one module: one, or the consecutive parts of a fused one, in row order.
        size_t i1 = i0 + 1;
        while (i1 < ls.size() && jobs[i1] == jobs[i0]) ++i1;
        const QuantJob& job = P.jobs[jobs[i0]];
        for (size_t i = i0; i < i1; ++i) pass->set_weight(ls[i], qs[i]);
        QuantizedLinear q;
        if (i1 - i0 == 1 && !linear_source(c, b, ls[i0]).fused()) {
          q = std::move(qs[i0]);
        } else {
          q = concat_n(std::vector<QuantizedLinear>(qs.begin() + ptrdiff_t(i0), qs.begin() + ptrdiff_t(i1)), job.prefix);
          if (q.n != job.desc.n)
            fail(ErrorKind::Internal, job.prefix + ": its parts hold " + std::to_string(q.n) + " of " +
                                          std::to_string(job.desc.n) + " rows");
        }
        GptqStats s = st[i0];
        if (i1 - i0 > 1) {
          // The module's error over all its rows, from the checkpoint's weights; losses add, and times add
          // where the parts ran one after another (the GPU pass runs them at once).
          const std::vector<float> W = to_float(ck.data(job.prefix + ".weight"), job.info->dtype);  // [n, k]
          s.rel_weight_err = quant::relative_weight_error(W.data(), q);
          for (size_t i = i0 + 1; i < i1; ++i) {
            s.loss += st[i].loss;
            s.seconds = gpu_forward ? std::max(s.seconds, st[i].seconds) : s.seconds + st[i].seconds;
            s.damp_used = std::max(s.damp_used, st[i].damp_used);
          }
        }
        finished.push_back({q, {}});
        const auto t_w = Clock::now();
        q = write_quantized(w, qo, job, std::move(q), rep);
        I.seconds_pack += since(t_w);
        // The layer's time is its GPTQ time (layers of a group may have run together).
        QuantizedLayerReport lr{job.prefix, q.n, q.k, s.rel_weight_err, s.seconds, s.loss, s.damp_used};
        finished.back().report = lr;
        report(jobs[i0], lr);
        i0 = i1;
      }
    };
    if (b < resumed) {
      const auto t_r = Clock::now();
      replay_block(resume, b, P, qo, w, rep, *pass, c, report);
      I.seconds_io += since(t_r);
    } else if (go.true_sequential) {
      for (LinearInput g : kGroups) {
        pass->capture({g});
        quantize_group(g);
      }
    } else {
      pass->capture({LinearInput::QKV, LinearInput::O, LinearInput::GateUp, LinearInput::Down});
      for (LinearInput g : kGroups) quantize_group(g);
    }
    // The next block's inputs come from this block with its quantized weights.
    pass->advance();
    if (b >= resumed) {
      const auto t_s = Clock::now();
      saver.save(b, std::move(finished));  // waits for block b - 1's save first
      I.seconds_io += since(t_s);
      resumable = true;  // from here a failure leaves a job (at worst without block b, recomputed)
    }
    // This block's expert linears without calibration tokens, computed or replayed (their reports say loss -1).
    int64_t unrouted = 0;
    for (size_t i = reported_before; i < rep.layers.size(); ++i) unrouted += rep.layers[i].loss < 0;
    // ETA from the blocks computed so far (replayed ones are much faster and say nothing about the rest).
    const double block_s = since(t_block);
    std::string eta;
    if (b >= resumed) {
      computed_s += block_s;
      const double left = computed_s / double(b + 1 - resumed) * double(c.layers - 1 - b);
      eta = ", eta " + std::to_string(int64_t(std::llround(left))) + " s";
    }
    say("block " + std::to_string(b + 1) + "/" + std::to_string(c.layers) + (b < resumed ? " replayed" : " done") +
        " in " + std::to_string(block_s).substr(0, 5) + " s" + eta +
        (unrouted ? "; " + std::to_string(unrouted) + " expert linears had no calibration token routed to them "
                        "(GPTQ with H = I: their weights alone decide)"
                  : std::string()));
    if (b >= resumed && go.stop_after_block == b + 1) {
      saver.wait();
      fail(ErrorKind::Internal, "stopped after block " + std::to_string(b + 1) +
                                    " was saved, as the testing hook asked (a simulated interruption)");
    }
  }
  {
    const auto t_s = Clock::now();
    saver.wait();
    I.seconds_io += since(t_s);
  }

  // The decoder blocks' MoE experts no calibration token reached (in computed and replayed blocks alike: their
  // linears' reports say loss -1), named in the record so that a user sees which experts more calibration text
  // would help. An expert's gate, up and down share its tokens: it is listed once ("...mlp.experts.5").
  std::vector<std::string> uncalibrated;
  std::set<std::string> listed;
  for (const QuantizedLayerReport& lr : rep.layers) {
    if (lr.loss >= 0) continue;
    const std::string expert = lr.name.substr(0, lr.name.rfind('.'));
    if (listed.insert(expert).second) uncalibrated.push_back(expert);
  }
  // Linears outside the decoder blocks (lm_head with --include-lm-head): no calibrated inputs here,
  // so round-to-nearest with the clip search.
  for (size_t j = 0; j < P.jobs.size(); ++j) {
    if (done[j]) continue;
    const QuantJob& job = P.jobs[j];
    const auto t_q = Clock::now();
    std::vector<float> Wf = to_float(ck.data(job.prefix + ".weight"), job.info->dtype);  // [n, k]
    RtnOptions ro;
    ro.bits = qo.bits; ro.group_size = qo.group_size; ro.clip = true; ro.name = job.prefix;
    ro.bf16_scales = grid_bf16(qo, job);
    RtnStats st;
    write_quantized(w, qo, job, rtn_quantize(Wf.data(), job.desc.n, job.desc.k, ro, &st), rep);
    report(j, QuantizedLayerReport{job.prefix, job.desc.n, job.desc.k, st.rel_weight_err, since(t_q)});
    say(job.prefix + ": outside the decoder blocks, quantized with RTN + clip (no calibrated inputs)");
  }

  nlohmann::json record = {{"method", "gptq"},
                           {"clip", base.clip == GptqOptions::Marlin ? "marlin" : "none"},
                           {"damp", float_as_decimal(base.damp)},
                           {"order", order_name(base.order)},
                           {"sparsity", base.sparse24 ? "2:4" : "none"},
                           {"true_sequential", go.true_sequential},
                           {"calibration", I.calibration}};
  if (on_gpu) record["forward_device"] = gpu_forward ? "cuda" : "cpu";  // the pass's arithmetic: 16-bit or fp32 GEMMs
  if (c.has_moe()) record["expert_calibration"] = go.expert_calibration == ExpertCalibration::All ? "all" : "routed";
  if (!uncalibrated.empty()) {
    record["uncalibrated_experts"] = uncalibrated;
    rep.notes.push_back(std::to_string(uncalibrated.size()) + " experts had no calibration token routed to them and "
                        "were quantized without calibration (listed as uncalibrated_experts in the config); more or "
                        "longer calibration samples reach more experts");
  }
  t_io = Clock::now();
  finish_output(w, ck, qo, P, rep, nlohmann::json{{"marlinc", record}});
  if (base.order == GptqOptions::DynamicActOrder)
    rep.notes.push_back("--order dynamic stores act-order groups (g_idx), which current serving stacks no longer run: "
                        "vLLM removed g_idx support in September 2026 (vllm#54809) and compressed-tensors 0.20 refuses "
                        "actorder \"group\"; --order static or gar also calibrate in activation order and store no g_idx");
  I.seconds_io += since(t_io);
  I.seconds_forward = pass->times().forward;
  I.seconds_hessian = pass->times().hessian;
  I.seconds_gptq = pass->times().gptq;
  std::string why;
  if (resume.on_disk() && !resume.remove(&why))
    say("warning: the output is complete, but the job " + job_dir.string() + " could not be removed: " + why);
  rep.seconds = since(t_start);
  if (info) *info = I;
  return rep;
}

QuantizeReport gptq_quantize_checkpoint(const std::filesystem::path& in, const std::filesystem::path& out,
                                        const QuantizeOptions& qo, const GptqRunOptions& go, const LayerDone& on_layer,
                                        const RunLog& log, GptqRunInfo* info) {
  bool resumable = false;
  try {
    // --order dynamic writes a non-trivial g_idx in every module, and configs that say so.
    QuantizeOptions o = qo;
    o.act_order = go.gptq.order == GptqOptions::DynamicActOrder;
    o.calibration_act_order = go.gptq.order == GptqOptions::StaticActOrder || go.gptq.order == GptqOptions::Gar;
    return run_gptq(in, out, o, go, on_layer, log, info, resumable);
  } catch (const Error& e) {
    if (!resumable) throw;
    throw Error(e.kind(), e.what() + resume_hint(out));
  } catch (const std::exception& e) {
    if (!resumable) throw;
    throw Error(ErrorKind::Internal, e.what() + resume_hint(out));
  }
}

}  // namespace marlinc::calib
