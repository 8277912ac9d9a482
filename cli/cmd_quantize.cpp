// marlinc quantize MODEL_DIR OUT_DIR --method {rtn,gptq} --format {marlin,marlin24,gptq,gptq_v2,compressed-tensors}
//                  --group {-1,32,64,128} [--clip/--no-clip] [--skip PATTERN]... [--json REPORT]
//                  gptq: [--calib FILE --samples N --min-len L --max-len L --seed S] [--order O]
//                        [--sparsity 2:4] [--true-sequential] [--damp D] [--device cpu|cuda]
//                        [--forward-device cpu|cuda] [--expert-calibration routed|all] [--restart]
// An interrupted gptq run resumes from its last finished block (OUT_DIR.marlinc-job/, see
// quantizer/calib/job_file.h). Testing hook: MARLINC_TEST_STOP_AFTER_BLOCK=N in the environment stops
// the run with an error right after block N is saved, as if it had been killed there.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <iostream>

#include "checkpoint/error.h"
#include "cli/commands.h"
#include "cli/output.h"
#include "packer/formats/convert.h"
#include "quantizer/calib/gptq_runner.h"
#include "quantizer/quantize_checkpoint.h"

namespace marlinc::cli {

namespace {

struct QuantizeArgs {
  std::string in, out, format = "marlin", method = "rtn", json, shard_size = "5GB";
  int group = 128, bits = 4, tp = 1;
  bool clip = true, no_clip = false, overwrite = false, include_lm_head = false;
  std::vector<std::string> skip;
  // gptq
  std::string calib, calib_format = "auto", order = "natural", sparsity = "none", device = "cpu", forward_device,
      expert_calibration = "routed";
  size_t samples = 128, min_len = 32, max_len = 2048;
  uint64_t seed = 0;
  float damp = 0.01f;
  bool true_sequential = false, restart = false;
  std::vector<const CLI::Option*> gptq_only;  // options that mean nothing to --method rtn
};

GptqOptions::Order order_from_name(const std::string& s) {
  if (s == "natural") return GptqOptions::Natural;
  if (s == "static") return GptqOptions::StaticActOrder;
  if (s == "gar") return GptqOptions::Gar;
  return GptqOptions::DynamicActOrder;  // "dynamic" (CLI11 checks the set)
}

calib::GptqRunOptions gptq_run_options(const QuantizeArgs& a) {
  calib::GptqRunOptions g;
  if (!a.calib.empty()) {
    std::error_code ec;
    if (std::filesystem::is_directory(a.calib, ec)) bad_usage("--calib " + a.calib + ": is a directory; give a file");
    g.calib_file = a.calib;
  }
  g.calib.format = calib::calib_format_from_name(a.calib_format);
  g.calib.samples = a.samples;
  if (a.calib.empty()) g.generated_samples = std::min<size_t>(a.samples, g.generated_samples);
  g.calib.min_len = a.min_len;
  g.calib.max_len = a.max_len;
  g.calib.seed = a.seed;
  g.gptq.clip = a.clip ? GptqOptions::Marlin : GptqOptions::None;
  g.gptq.order = order_from_name(a.order);
  g.gptq.sparse24 = a.sparsity == "2:4";
  g.gptq.damp = a.damp;
  g.gptq.device = a.device == "cuda" ? GptqOptions::Device::Cuda : GptqOptions::Device::Cpu;
  g.true_sequential = a.true_sequential;
  g.forward_on_cpu = a.forward_device == "cpu";  // with --device cpu the runner refuses it by name
  g.expert_calibration = a.expert_calibration == "all" ? calib::ExpertCalibration::All : calib::ExpertCalibration::Routed;
  if (a.forward_device == "cuda" && a.device != "cuda")
    bad_usage("--forward-device cuda needs --device cuda (the forward pass runs where GPTQ does, or on the CPU)");
  g.restart = a.restart;
  // The CLI, not the library, reads the environment: the hook reaches the runner as an option.
  if (const char* stop = std::getenv("MARLINC_TEST_STOP_AFTER_BLOCK"); stop && *stop) {
    const std::string v = stop;
    if (v.find_first_not_of("0123456789") != std::string::npos || v.size() > 9)
      bad_usage("MARLINC_TEST_STOP_AFTER_BLOCK=" + v + ": expected a block number (1-based)");
    g.stop_after_block = std::stoll(v);
  }
  return g;
}

int run_quantize(const QuantizeArgs& a) {
  QuantizeOptions o;
  if (!a.json.empty()) {
    check_output_file("--json", a.json, a.out);
    check_not_input_file("--json", a.json, a.in, a.calib);
  }
  auto t = target_from_name(a.format);
  if (!t) bad_usage("--format " + a.format + ": expected marlin, marlin24, gptq, gptq_v2, compressed-tensors or awq");
  const OutputLock lock = lock_output(a.out, "quantize", a.in);
  note_stale_outputs(a.out);
  o.to = *t;
  o.method = a.method;
  o.bits = a.bits;
  o.group_size = a.group;
  o.clip = a.clip;
  o.skip = a.skip;
  o.include_lm_head = a.include_lm_head;
  o.overwrite = a.overwrite;
  o.tp = a.tp;
  o.max_shard_bytes = parse_size(a.shard_size);
  auto t0 = std::chrono::steady_clock::now();
  auto on_layer = [&](const QuantizedLayerReport& l, size_t i, size_t total) {
    // The ETA counts from the first layer's start: calibration before it is not per-layer work.
    if (i == 0) t0 = std::chrono::steady_clock::now() - std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                                                             std::chrono::duration<double>(l.seconds));
    double elapsed = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    double eta = elapsed / double(i + 1) * double(total - i - 1);
    char gptq[64] = "";
    if (l.loss >= 0) std::snprintf(gptq, sizeof gptq, "  loss %.3e  damp %.3f", l.loss, l.damp);
    std::printf("%-48s %6lld x %-6lld  rel err %.4e%s  %7.3fs  [%zu/%zu, eta %.0fs]\n", l.name.c_str(), (long long)l.n,
                (long long)l.k, l.rel_weight_err, gptq, l.seconds, i + 1, total, eta);
    std::fflush(stdout);
  };
  QuantizeReport r;
  calib::GptqRunInfo info;
  if (a.method == "gptq") {
    auto log = [](const std::string& s) { std::printf("%s\n", s.c_str()); std::fflush(stdout); };
    r = calib::gptq_quantize_checkpoint(a.in, a.out, o, gptq_run_options(a), on_layer, log, &info);
  } else {
    for (const CLI::Option* opt : a.gptq_only)
      if (opt->count() > 0) bad_usage(opt->get_name() + " applies to --method gptq only");
    r = quantize_checkpoint(a.in, a.out, o, on_layer);
  }
  for (auto& [name, why] : r.skipped) std::printf("%-48s skipped: %s\n", name.c_str(), why.c_str());
  for (const auto& n : r.notes) std::printf("note: %s\n", n.c_str());
  if (o.to == TargetFormat::Marlin && a.order == "dynamic" && !r.layers.empty())
    std::printf("note: %s\n", kMarlinActOrderNote);
  double mean = 0;
  for (auto& l : r.layers) mean += l.rel_weight_err;
  mean /= double(std::max<size_t>(1, r.layers.size()));
  std::printf("\nquantized  %zu layers (%s, %d-bit, group %d%s%s) -> %s\n", r.layers.size(), r.method.c_str(), a.bits,
              a.group, a.clip ? ", clip search" : "", a.method == "gptq" && (a.sparsity == "2:4" || a.format == "marlin24") ? ", 2:4" : "",
              r.target.c_str());
  std::printf("kept       %zu tensors unchanged, %zu linear layers skipped\n", r.passthrough_tensors, r.skipped.size());
  std::printf("mean rel weight error %.4e\nbytes      %.2f MB -> %.2f MB\ntime       %.2fs\n", mean,
              double(r.bytes_in) / 1e6, double(r.bytes_out) / 1e6, r.seconds);
  nlohmann::json j = r.to_json();
  if (a.method == "gptq") {
    std::printf("split      forward %.2fs, hessians %.2fs, gptq %.2fs, pack+write %.2fs, other i/o %.2fs\n"
                "calibrated %zu samples, %zu tokens\n",
                info.seconds_forward, info.seconds_hessian, info.seconds_gptq, info.seconds_pack, info.seconds_io,
                info.samples, info.tokens);
    if (info.resumed_blocks > 0)
      std::printf("resumed    %lld block%s from an interrupted run (their layers' times are from that run)\n",
                  (long long)info.resumed_blocks, info.resumed_blocks == 1 ? "" : "s");
    j["resumed_blocks"] = info.resumed_blocks;
    j["calibration"] = info.calibration;
    j["split_seconds"] = {{"forward", info.seconds_forward}, {"hessians", info.seconds_hessian},
                          {"gptq", info.seconds_gptq}, {"pack", info.seconds_pack}, {"io", info.seconds_io}};
  }
  std::printf("output     %s\n", r.output.c_str());
  if (!a.json.empty()) write_file_atomic(a.json, json_text(j) + "\n");
  return 0;
}

}  // namespace

void register_quantize(CLI::App& app) {
  auto* cmd = app.add_subcommand("quantize", "Quantize a FP16/BF16/FP32 checkpoint and write it as Marlin, GPTQ or compressed-tensors");
  auto a = std::make_shared<QuantizeArgs>();
  cmd->add_option("MODEL_DIR", a->in, "Hugging Face checkpoint (directory or .safetensors file)")->required();
  cmd->add_option("OUT_DIR", a->out, "output directory (written atomically)")->required();
  cmd->add_option("--method", a->method, "rtn (data-free; the default) or gptq (calibrated, sequential over blocks)")
      ->check(CLI::IsMember({"rtn", "gptq"}));
  cmd->add_option("--format", a->format, "marlin (the default), marlin24 (gptq + 2:4), gptq, gptq_v2, compressed-tensors or awq");
  cmd->add_option("--group", a->group, "group size along k: -1 (per channel), 32, 64 or 128 (default 128)");
  cmd->add_option("--bits", a->bits, "4 (the default) or 8")->check(CLI::IsMember({4, 8}));
  // Two flags, not CLI11's "--clip,!--no-clip", whose help reads "--no-clip{false}"; giving both is an error.
  auto* clip_on = cmd->add_flag("--clip")->description("search a clipping factor per group (the default)");
  auto* clip_off = cmd->add_flag("--no-clip", a->no_clip, "round to nearest on the min-max grid, no clipping search");
  clip_on->excludes(clip_off);
  cmd->add_option("--skip", a->skip, "leave modules whose name contains PATTERN unquantized (repeatable)");
  cmd->add_flag("--include-lm-head", a->include_lm_head, "quantize lm_head too (embeddings never: they are not linear layers)");
  cmd->add_option("--shard-size", a->shard_size, "largest shard, e.g. 5GB, 500MB, 0 = one file (default 5GB)");
  cmd->add_flag("--overwrite", a->overwrite, "replace OUT_DIR and everything in it if it holds an earlier output (*.safetensors)");
  cmd->add_option("--tp", a->tp,
                  "tensor-parallel size the output will be served at: layers whose part on one GPU breaks the "
                  "format's rules (e.g. k / tp % 128 for Marlin) stay unquantized, as other incompatible layers do "
                  "(default 1)")
      ->check(CLI::Range(1, 65536));
  cmd->add_option("--json", a->json, "write a JSON report to this file");
  auto gptq_opt = [&](CLI::Option* o) { a->gptq_only.push_back(o); return o; };
  gptq_opt(cmd->add_option("--calib", a->calib,
                           "gptq: calibration text, JSONL with \"text\", or pre-tokenized JSONL (default: samples the "
                           "model generates itself; real text is better)"));
  gptq_opt(cmd->add_option("--calib-format", a->calib_format, "gptq: auto (the default), text, text-whole, jsonl or tokens"))
      ->check(CLI::IsMember({"auto", "text", "text-whole", "jsonl", "tokens"}));
  gptq_opt(cmd->add_option("--samples", a->samples, "gptq: calibration samples (whole documents), default 128; without "
                                                    "--calib, at most this many (32) generated ones"));
  gptq_opt(cmd->add_option("--min-len", a->min_len, "gptq: shortest document kept, in tokens (default 32)"));
  gptq_opt(cmd->add_option("--max-len", a->max_len, "gptq: longest document kept, never truncated (default 2048)"));
  gptq_opt(cmd->add_option("--seed", a->seed, "gptq: sampling seed (default 0)"));
  gptq_opt(cmd->add_option("--order", a->order,
                           "gptq: column order natural (the default), static (act-order, static groups), gar (group-aware "
                           "act-order) or dynamic (act-order g_idx: GPTQ, compressed-tensors, and Marlin with marlinc's perm "
                           "extension, docs/FORMATS.md; not AWQ or marlin24; vLLM no longer runs g_idx since 2026-09)"))
      ->check(CLI::IsMember({"natural", "static", "gar", "dynamic"}));
  gptq_opt(cmd->add_option("--sparsity", a->sparsity, "gptq: none (the default) or 2:4 (SparseGPT jointly with 4-bit)"))
      ->check(CLI::IsMember({"none", "2:4"}));
  gptq_opt(cmd->add_flag("--true-sequential", a->true_sequential,
                         "gptq: re-run each block after every linear group is quantized"));
  gptq_opt(cmd->add_option("--damp", a->damp, "gptq: relative damping (default 0.01; raised automatically when Cholesky fails)"));
  gptq_opt(cmd->add_option("--device", a->device, "gptq: cpu (the default) or cuda"))->check(CLI::IsMember({"cpu", "cuda"}));
  gptq_opt(cmd->add_option("--forward-device", a->forward_device,
                           "gptq: where the calibration forward pass and Hessians run: --device's (the default), or cpu "
                           "with --device cuda (fp32 in host memory, GPTQ on the GPU: for a model whose GPU pass does not "
                           "fit the GPU)"))
      ->check(CLI::IsMember({"cpu", "cuda"}));
  gptq_opt(cmd->add_option("--expert-calibration", a->expert_calibration,
                           "gptq, mixture-of-experts models: routed (the default: each expert's Hessian from the tokens "
                           "the router sends it) or all (from every token, as llm-compressor's calibrate_all_experts: "
                           "no expert goes uncalibrated; the hidden states still follow the router)"))
      ->check(CLI::IsMember({"routed", "all"}));
  gptq_opt(cmd->add_flag("--restart", a->restart,
                         "gptq: discard an unfinished job (OUT_DIR.marlinc-job/) instead of resuming it, and start "
                         "fresh"));
  cmd->footer(
      "Resume (--method gptq): an interrupted run keeps its finished blocks in OUT_DIR.marlinc-job/ beside the "
      "output; the same command run again resumes from the last finished block and writes the same bytes as an "
      "uninterrupted run. A job made with another model, calibration or output-changing option is refused, naming "
      "what differs; --restart discards it. The job directory is removed once the output is complete.");
  cmd->callback([a] {
    a->clip = !a->no_clip;
    set_status(run_quantize(*a));
  });
}

}  // namespace marlinc::cli
