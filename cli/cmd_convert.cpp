// `marlinc convert IN OUT --to FORMAT`: parse, call packer/formats/convert.h, print one line per layer,
// a summary, or the JSON report. Exit 1 when the target cannot hold some layers (nothing is written).
#include <cstdio>
#include <iostream>

#include "checkpoint/error.h"
#include "cli/commands.h"
#include "cli/output.h"
#include "packer/formats/convert.h"

namespace marlinc::cli {

namespace {

std::string human_bytes(uint64_t b) {
  char buf[32];
  if (b >= 1000000000ull) std::snprintf(buf, sizeof buf, "%.2f GB", double(b) / 1e9);
  else if (b >= 1000000ull) std::snprintf(buf, sizeof buf, "%.1f MB", double(b) / 1e6);
  else if (b >= 1000ull) std::snprintf(buf, sizeof buf, "%.1f kB", double(b) / 1e3);
  else std::snprintf(buf, sizeof buf, "%llu B", static_cast<unsigned long long>(b));
  return buf;
}

std::string kn_str(int64_t k, int64_t n) { return "[" + std::to_string(k) + " x " + std::to_string(n) + "]"; }

struct Args {
  std::string in, out, to, shard = "5GB";
  bool keep = false, overwrite = false, json = false;
  int tp = 1;
};

void run_convert(const Args& a) {
  ConvertOptions o;
  auto t = target_from_name(a.to);
  if (!t) bad_usage("--to " + a.to + ": unknown format (use marlin, marlin24, gptq, gptq_v2, compressed-tensors, awq)");
  const OutputLock lock = lock_output(a.out, "convert", a.in);
  note_stale_outputs(a.out);
  o.to = *t;
  o.keep_incompatible = a.keep;
  o.tp = a.tp;
  o.overwrite = a.overwrite;
  o.max_shard_bytes = parse_size(a.shard);
  if (!a.json) {
    o.on_module = [](const ConvertedModule& m, size_t i, size_t total) {
      std::printf("  [%4zu/%zu] %-48s %-14s %-8s -> %-18s %10s -> %10s %7.2f s\n", i + 1, total, m.prefix.c_str(),
                  kn_str(m.k, m.n).c_str(), m.from.c_str(), m.to.c_str(), human_bytes(m.bytes_in).c_str(),
                  human_bytes(m.bytes_out).c_str(), m.seconds);
      std::fflush(stdout);
    };
    std::printf("marlinc convert: %s -> %s (--to %s)\n", a.in.c_str(), a.out.c_str(), target_name(o.to).c_str());
    std::fflush(stdout);
  }
  auto print_source = [](const ConvertReport& r) {
    const std::string label = r.source_label.empty() ? "" : " (config label \"" + r.source_label + "\")";
    std::printf("source: %s%s\n", r.source_format.c_str(), label.c_str());
    for (const auto& n : r.notes) std::printf("note: %s\n", n.c_str());
    std::fflush(stdout);
  };
  bool started = false;
  if (!a.json) o.on_start = [&](const ConvertReport& r) { print_source(r); started = true; };
  ConvertReport r;
  try {
    r = convert_checkpoint(a.in, a.out, o);
  } catch (const Error& e) {
    // --json promises a report on stdout: a stop during the conversion (e.g. codes that are not 2:4) is
    // one too, then the error goes its usual way (stderr, exit code).
    if (a.json)
      std::cout << json_text({{"ok", false}, {"input", a.in}, {"output", nullptr}, {"target", a.to}, {"error", e.what()}})
                << "\n";
    throw;
  }
  if (a.json) {
    std::cout << json_text(r.to_json()) << "\n";
  } else {
    if (!started) print_source(r);
    for (const auto& m : r.modules)
      if (!m.rule.empty()) std::printf("kept dequantized: %s: %s\n", m.prefix.c_str(), m.rule.c_str());
  }
  if (!r.ok) {
    std::fprintf(stderr, "marlinc: error: %zu module(s) cannot be written as %s:\n", r.incompatible.size(),
                 r.target.c_str());
    for (const auto& m : r.incompatible)
      std::fprintf(stderr, "  %s %s (%d-bit, group %d; tensors %s...): %s\n", m.prefix.c_str(), kn_str(m.k, m.n).c_str(),
                   m.bits, m.group_size, m.tensors.empty() ? "?" : m.tensors.front().c_str(), m.rule.c_str());
    std::fprintf(stderr,
                 "nothing was written. Rerun with --keep-incompatible to keep these layers as dequantized weights "
                 "(plain <p>.weight, listed as not converted in the config), or choose another --to format.\n");
    set_status(1);
    return;
  }
  if (!a.json) {
    size_t deq = 0;
    for (const auto& m : r.modules) deq += !m.rule.empty();
    std::printf("summary: %zu modules converted to %s, %zu kept dequantized; %zu tensors passed through (%s); "
                "%zu files copied\n",
                r.modules.size() - deq, r.target.c_str(), deq, r.passthrough_tensors,
                human_bytes(r.passthrough_bytes).c_str(), r.copied_files.size());
    std::printf("         tensor bytes %s -> %s in %zu shard(s); %.2f s (%.2f GB/s read)\n", human_bytes(r.bytes_in).c_str(),
                human_bytes(r.bytes_out).c_str(), r.shards, r.seconds,
                r.seconds > 0 ? double(r.bytes_in) / 1e9 / r.seconds : 0.0);
    std::printf("wrote %s\n", r.output.c_str());
  }
  set_status(0);
}

}  // namespace

void register_convert(CLI::App& app) {
  auto* cmd = app.add_subcommand("convert", "Convert a quantized checkpoint between GPTQ, AWQ, compressed-tensors and Marlin");
  static Args a;
  cmd->add_option("IN", a.in, "source checkpoint (directory or .safetensors file)")->required();
  cmd->add_option("OUT", a.out, "output directory (created atomically)")->required();
  cmd->add_option("--to", a.to, "target: marlin, marlin24, gptq, gptq_v2, compressed-tensors, awq")->required();
  cmd->add_flag("--keep-incompatible", a.keep,
                "keep layers the target cannot hold as dequantized weights instead of stopping");
  cmd->add_option("--shard-size", a.shard, "max tensor bytes per shard, e.g. 5GB, 500MB; 0 = one file (default 5GB)");
  cmd->add_flag("--overwrite", a.overwrite, "replace OUT_DIR and everything in it if it holds an earlier output (*.safetensors)");
  cmd->add_option("--tp", a.tp,
                  "tensor-parallel size the output will be served at: a layer whose part on one GPU breaks the "
                  "target's rules is incompatible (default 1)")
      ->check(CLI::Range(1, 65536));
  cmd->add_flag("--json", a.json, "print the report as JSON on stdout");
  cmd->callback([] { run_convert(a); });
}

}  // namespace marlinc::cli
