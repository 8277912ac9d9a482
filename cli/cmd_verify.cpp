// marlinc verify DIR [--reference FP_DIR] [--certificate OUT.json] [--check-certificate CERT.json]
//                    [--json] [--cpu]
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iostream>

#include "checkpoint/error.h"
#include "cli/commands.h"
#include "cli/output.h"
#include "verify/verify.h"

namespace marlinc::cli {

namespace {

struct VerifyArgs {
  std::string dir, reference, certificate, check_certificate;
  bool json = false, cpu = false;
  uint64_t seed = 0;
};

std::string layer_line(const LayerReport& L) {
  std::string status = L.ok() ? "ok" : "FAIL";
  double worst = 0;
  for (auto& a : L.arith) worst = std::max(worst, a.mean_rel_err);
  char buf[512];
  if (L.k == 0)  // not readable as a module: no shape to show
    std::snprintf(buf, sizeof buf, "%-48s %15s %-5s %-4s", L.name.c_str(), "-", "", status.c_str());
  else
    std::snprintf(buf, sizeof buf, "%-48s %6lld x %-6lld g%-4d %-4s arith %.2e", L.name.c_str(), (long long)L.n,
                  (long long)L.k, L.group_size, status.c_str(), worst);
  std::string line = buf;
  if (L.output_rel_err >= 0) {
    std::snprintf(buf, sizeof buf, "  ref w %.3e y %.3e%s", L.weight_rel_err, L.output_rel_err, L.outlier ? " OUTLIER" : "");
    line += buf;
  }
  std::snprintf(buf, sizeof buf, "  %6.2fs", L.seconds);
  line += buf;
  for (auto& c : L.checks)
    if (!c.ok) line += "\n    " + c.name + ": " + c.detail;
  return line;
}

int run_check_certificate(const VerifyArgs& a) {
  if (!std::filesystem::is_regular_file(a.check_certificate))
    bad_usage(a.check_certificate + ": not a file (--check-certificate)");
  std::ifstream in(a.check_certificate);
  if (!in) bad_usage(a.check_certificate + ": cannot open the certificate (--check-certificate)");
  nlohmann::json cert;
  try {
    cert = nlohmann::json::parse(in);
  } catch (const nlohmann::json::exception& e) {
    bad_data(a.check_certificate + ": not valid JSON: " + e.what());
  }
  std::vector<std::string> problems = check_certificate(a.dir, cert);
  if (a.json) {
    std::cout << json_text(nlohmann::json{{"certificate", a.check_certificate}, {"ok", problems.empty()}, {"problems", problems}})
              << "\n";
  } else {
    for (auto& p : problems) std::cout << "CHANGED  " << p << "\n";
    std::cout << (problems.empty() ? "ok: " : "FAIL: ") << a.dir << " " << (problems.empty() ? "matches" : "does not match")
              << " " << a.check_certificate << " (" << problems.size() << " problem" << (problems.size() == 1 ? "" : "s")
              << ")\n";
  }
  return problems.empty() ? 0 : 1;
}

int run_verify(const VerifyArgs& a) {
  if (!a.check_certificate.empty()) return run_check_certificate(a);
  if (!a.certificate.empty()) {
    check_output_file("--certificate", a.certificate);
    check_not_input_file("--certificate", a.certificate, a.dir);
    if (!a.reference.empty()) check_not_input_file("--certificate", a.certificate, a.reference);
  }
  VerifyOptions opt;
  if (!a.reference.empty()) opt.reference = a.reference;
  opt.force_cpu = a.cpu;
  opt.seed = a.seed;
  auto on_layer = [&](const LayerReport& L, size_t i, size_t total) {
    if (!a.json) std::cout << layer_line(L) << std::endl;
    else std::cerr << "\r[" << (i + 1) << "/" << total << "] " << L.name << std::flush;
  };
  VerifyReport rep = verify_checkpoint(a.dir, opt, on_layer);
  nlohmann::json cert = rep.certificate();
  if (!a.certificate.empty()) write_file_atomic(a.certificate, json_text(cert) + "\n");
  if (a.json) {
    std::cerr << "\n";
    std::cout << json_text(cert) << "\n";
  } else {
    // Outliers are found once every layer is in, after their lines were printed as they finished.
    for (const auto& L : rep.layers)
      if (L.outlier)
        for (const auto& c : L.checks)
          if (!c.ok && c.name == "reference") std::cout << "OUTLIER  " << L.name << ": " << c.detail << "\n";
    for (auto& p : rep.global_problems) std::cout << "PROBLEM  " << p << "\n";
    for (auto& n : rep.format_notes) std::cout << "note: " << n << "\n";
    const auto& s = cert["summary"];
    std::cout << "\nformat     " << rep.format << "\nbackend    " << rep.backend << "\nlayers     " << s["layers"]
              << " (" << s["passed"] << " passed, " << s["failed"] << " failed)\n";
    if (!a.certificate.empty()) std::cout << "certificate " << a.certificate << "\n";
    std::cout << (rep.ok() ? "VERIFIED" : "NOT VERIFIED") << "\n";
  }
  return rep.ok() ? 0 : 1;
}

}  // namespace

void register_verify(CLI::App& app) {
  auto* cmd = app.add_subcommand("verify", "Check every quantized layer (structure, layout, arithmetic) and certify it");
  auto a = std::make_shared<VerifyArgs>();
  cmd->add_option("DIR", a->dir, "checkpoint directory (or safetensors file) to verify")->required();
  cmd->add_option("--reference", a->reference, "the FP16/BF16 checkpoint the layers were quantized from");
  cmd->add_option("--certificate", a->certificate, "write the JSON certificate to this file");
  cmd->add_option("--check-certificate", a->check_certificate,
                  "re-check DIR against an earlier certificate (hashes and structure only; fast)");
  cmd->add_flag("--json", a->json, "print the certificate as JSON on stdout instead of the table");
  cmd->add_flag("--cpu", a->cpu, "use the CPU reference GEMM even when a GPU is present");
  cmd->add_option("--seed", a->seed, "seed of the random activations (default 0)");
  cmd->callback([a] { set_status(run_verify(*a)); });
}

}  // namespace marlinc::cli
