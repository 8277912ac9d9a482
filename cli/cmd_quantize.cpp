// marlinc quantize MODEL_DIR OUT_DIR --method rtn --format {marlin,gptq,gptq_v2,compressed-tensors}
//                  --group {-1,32,64,128} [--clip/--no-clip] [--skip PATTERN]... [--json REPORT]
#include <chrono>
#include <cstdio>
#include <iostream>

#include "checkpoint/error.h"
#include "cli/commands.h"
#include "cli/output.h"
#include "packer/formats/convert.h"
#include "quantizer/quantize_checkpoint.h"

namespace marlinc::cli {

namespace {

struct QuantizeArgs {
  std::string in, out, format = "marlin", method = "rtn", json, shard_size = "5GB";
  int group = 128, bits = 4;
  bool clip = true, overwrite = false, include_lm_head = false;
  std::vector<std::string> skip;
};

int run_quantize(const QuantizeArgs& a) {
  QuantizeOptions o;
  auto t = target_from_name(a.format);
  if (!t) bad_usage("--format " + a.format + ": expected marlin, gptq, gptq_v2 or compressed-tensors");
  o.to = *t;
  o.method = a.method;
  o.bits = a.bits;
  o.group_size = a.group;
  o.clip = a.clip;
  o.skip = a.skip;
  o.include_lm_head = a.include_lm_head;
  o.overwrite = a.overwrite;
  o.max_shard_bytes = parse_size(a.shard_size);
  auto t0 = std::chrono::steady_clock::now();
  auto on_layer = [&](const QuantizedLayerReport& l, size_t i, size_t total) {
    double elapsed = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    double eta = elapsed / double(i + 1) * double(total - i - 1);
    std::printf("%-48s %6lld x %-6lld  rel err %.4e  %7.3fs  [%zu/%zu, eta %.0fs]\n", l.name.c_str(), (long long)l.n,
                (long long)l.k, l.rel_weight_err, l.seconds, i + 1, total, eta);
    std::fflush(stdout);
  };
  QuantizeReport r = quantize_checkpoint(a.in, a.out, o, on_layer);
  for (auto& [name, why] : r.skipped) std::printf("%-48s skipped: %s\n", name.c_str(), why.c_str());
  double mean = 0;
  for (auto& l : r.layers) mean += l.rel_weight_err;
  mean /= double(std::max<size_t>(1, r.layers.size()));
  std::printf("\nquantized  %zu layers (%s, %d-bit, group %d%s) -> %s\n", r.layers.size(), r.method.c_str(), a.bits, a.group,
              a.clip ? ", clip search" : "", r.target.c_str());
  std::printf("kept       %zu tensors unchanged, %zu linear layers skipped\n", r.passthrough_tensors, r.skipped.size());
  std::printf("mean rel weight error %.4e\nbytes      %.2f MB -> %.2f MB\ntime       %.2fs\noutput     %s\n", mean,
              double(r.bytes_in) / 1e6, double(r.bytes_out) / 1e6, r.seconds, r.output.c_str());
  if (!a.json.empty()) write_file_atomic(a.json, r.to_json().dump(2) + "\n");
  return 0;
}

}  // namespace

void register_quantize(CLI::App& app) {
  auto* cmd = app.add_subcommand("quantize", "Quantize a FP16/BF16/FP32 checkpoint and write it as Marlin, GPTQ or compressed-tensors");
  auto a = std::make_shared<QuantizeArgs>();
  cmd->add_option("MODEL_DIR", a->in, "Hugging Face checkpoint (directory or .safetensors file)")->required();
  cmd->add_option("OUT_DIR", a->out, "output directory (written atomically)")->required();
  cmd->add_option("--method", a->method, "quantization method: rtn (data-free)")->check(CLI::IsMember({"rtn"}));
  cmd->add_option("--format", a->format, "marlin, gptq, gptq_v2 or compressed-tensors");
  cmd->add_option("--group", a->group, "group size along k: -1 (per channel), 32, 64 or 128");
  cmd->add_option("--bits", a->bits, "4 or 8")->check(CLI::IsMember({4, 8}));
  cmd->add_flag("--clip,!--no-clip", a->clip, "search a clipping factor per group (default on)");
  cmd->add_option("--skip", a->skip, "leave modules whose name contains PATTERN unquantized (repeatable)");
  cmd->add_flag("--include-lm-head", a->include_lm_head, "quantize lm_head and embeddings too");
  cmd->add_option("--shard-size", a->shard_size, "largest shard, e.g. 5GB, 500MB, 0 = one file");
  cmd->add_flag("--overwrite", a->overwrite, "replace OUT_DIR if it exists");
  cmd->add_option("--json", a->json, "write a JSON report to this file");
  cmd->callback([a] { set_status(run_quantize(*a)); });
}

}  // namespace marlinc::cli
