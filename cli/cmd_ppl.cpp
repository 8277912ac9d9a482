// marlinc ppl: perplexity of a model on a text file with marlinc's own forward pass: CPU (fp32) or
// --device cuda (16-bit GEMM inputs, fp32 accumulation). A quantized checkpoint (GPTQ, Marlin,
// Marlin-24, AWQ, compressed-tensors) runs with its linears dequantized on the CPU, and on the GPU
// through marlinc's Marlin kernel where a layer fits it (dequantized on the device where not), so
// quantization quality is measured with the same forward pass as the original.
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <optional>
#include <sstream>

#include <nlohmann/json.hpp>

#include "checkpoint/error.h"
#include "checkpoint/json_strict.h"
#include "checkpoint/sha256.h"
#include "cli/commands.h"
#include "cli/output.h"
#include "quantizer/calib/llama.h"
#include "quantizer/calib/perplexity.h"
#include "quantizer/calib/quantized_linears.h"
#include "quantizer/calib/tokenizer.h"

namespace marlinc::cli {

namespace {

struct PplArgs {
  std::string model_dir, text;
  size_t ctx = 256, stride = 0, max_tokens = 0;
  bool json = false, quiet = false;
  std::string device = "cpu";
};

void run_ppl(const PplArgs& a) {
  using namespace marlinc::calib;
  std::error_code ec;
  if (std::filesystem::is_directory(a.text, ec)) bad_usage("--text " + a.text + ": is a directory; give a text file");
  std::ifstream f(a.text, std::ios::binary);
  if (!f) {
    (void)std::filesystem::status(a.text, ec);  // a parent that cannot be searched is not "no such file"
    if (ec == std::errc::no_such_file_or_directory) bad_usage("--text " + a.text + ": no such file");
    fail(ErrorKind::Io, a.text + ": cannot open the --text file");
  }
  std::ostringstream ss;
  ss << f.rdbuf();
  if (const size_t bad = detail::utf8_invalid_at(ss.str()); bad != std::string_view::npos)
    bad_data("--text " + a.text + ": not UTF-8 text (invalid byte at offset " + std::to_string(bad) + ")");
  const std::string text = normalize_newlines(ss.str());

  const bool quantized = detect_format(Checkpoint::open(a.model_dir)).format != Format::Plain;
  auto model = LlamaModel::open(a.model_dir, quantized);
  std::optional<QuantizedLinears> qlin;
  if (quantized) qlin.emplace(model.checkpoint(), model.config());
  auto tok = load_tokenizer(a.model_dir);
  if (tok->vocab_size() > model.config().vocab)
    bad_data(a.model_dir + ": the tokenizer has " + std::to_string(tok->vocab_size()) + " tokens but config.json vocab_size is " +
             std::to_string(model.config().vocab));
  std::vector<int32_t> ids = tok->encode(text, true);
  if (ids.size() < 2)
    bad_data("--text " + a.text + ": " + std::to_string(ids.size()) + " token" + (ids.size() == 1 ? "" : "s") +
             " (with the tokenizer's start token); perplexity needs at least 2");

  PplOptions opt;
  opt.ctx = a.ctx;
  opt.stride = a.stride;
  opt.max_tokens = a.max_tokens;
  opt.device = a.device == "cuda" ? PplOptions::Device::Cuda : PplOptions::Device::Cpu;
  size_t last_decile = 0;
  PplProgress progress = [&](size_t done, size_t total, size_t predicted, double nll) {
    if (a.quiet) return;
    const size_t decile = done * 10 / total;
    if (decile == last_decile && done != 1) return;
    last_decile = decile;
    std::fprintf(stderr, "ppl: window %zu/%zu, %zu tokens scored, running ppl %.4f\n", done, total, predicted,
                 std::exp(nll / static_cast<double>(predicted ? predicted : 1)));
  };
  PplResult r = perplexity(model, ids, opt, progress, qlin ? &*qlin : nullptr);
  const size_t stride = a.stride ? a.stride : a.ctx;
  const bool gpu = opt.device == PplOptions::Device::Cuda;
  std::string weights = qlin ? format_name(qlin->format().format) + " (dequantized)" : "plain";
  if (gpu && qlin)
    weights = format_name(qlin->format().format) + " (GPU: " + std::to_string(r.gpu_kernel) +
              " linears through the Marlin kernel, " + std::to_string(r.gpu_dequantized) + " dequantized on the device)";
  if (a.json) {
    nlohmann::json j = {{"model", a.model_dir},
                        {"architecture", model.config().architecture},
                        {"weights", weights},
                        {"device", a.device},
                        {"gpu_linears", {{"plain", r.gpu_plain}, {"marlin_kernel", r.gpu_kernel},
                                         {"dequantized", r.gpu_dequantized}}},
                        {"text", a.text},
                        {"text_sha256", sha256_file(a.text)},
                        {"tokenizer", tok->description()},
                        {"ctx", a.ctx},
                        {"stride", stride},
                        {"max_tokens", a.max_tokens},
                        {"tokens", r.tokens},
                        {"predicted", r.predicted},
                        {"windows", r.windows},
                        {"mean_nll", r.mean_nll},
                        {"ppl", r.ppl},
                        {"seconds", r.seconds}};
    std::cout << json_text(j) << "\n";
  } else {
    if (qlin) std::printf("weights: %s, %zu quantized linears\n", weights.c_str(), qlin->modules());
    if (gpu) std::printf("device: cuda (block linears: %d plain, %d Marlin kernel, %d dequantized)\n", r.gpu_plain,
                         r.gpu_kernel, r.gpu_dequantized);
    std::printf("ppl %.4f  (mean NLL %.6f over %zu predicted tokens; %zu tokens, %zu windows, ctx %zu, stride %zu, %.1f s)\n",
                r.ppl, r.mean_nll, r.predicted, r.tokens, r.windows, a.ctx, stride, r.seconds);
  }
}

}  // namespace

void register_ppl(CLI::App& app) {
  static PplArgs a;
  auto* cmd = app.add_subcommand("ppl", "Perplexity of a plain or quantized model on a text file (CPU or GPU forward pass)");
  cmd->add_option("MODEL_DIR", a.model_dir, "Hugging Face model directory (config.json, safetensors, tokenizer)")->required();
  cmd->add_option("--text", a.text, "UTF-8 text file; CRLF is read as LF; encoded whole, with BOS")->required();
  cmd->add_option("--ctx", a.ctx, "window length in tokens")->capture_default_str()->check(CLI::Range(2, 1 << 20));
  cmd->add_option("--stride", a.stride, "tokens between window starts (default: --ctx, non-overlapping)");
  cmd->add_option("--max-tokens", a.max_tokens, "score only the first N tokens of the text (0: all)");
  cmd->add_option("--device", a.device, "cpu (fp32) or cuda (16-bit GEMM inputs; quantized linears through the Marlin kernel)")
      ->check(CLI::IsMember({"cpu", "cuda"}))
      ->capture_default_str();
  cmd->add_flag("--json", a.json, "print the result as JSON");
  cmd->add_flag("--quiet", a.quiet, "no progress on stderr");
  cmd->callback([] {
    run_ppl(a);
    set_status(0);
  });
}

}  // namespace marlinc::cli
