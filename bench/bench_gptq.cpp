// CPU timing of the quantizer on one synthetic layer: Hessian accumulation, RTN (+Lp clip), GPTQ,
// GPTQ + Marlin clip, SparseGPT 2:4 + 4-bit. Prints a table; `--json FILE` writes the numbers.
// Usage: bench_gptq [--n 4096] [--k 4096] [--tokens 4096] [--json out.json] [--skip-sparse]
#include <omp.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include "quantizer/gptq.h"
#include "quantizer/hessian.h"
#include "quantizer/rtn.h"

using namespace marlinc;

namespace {

double now() { return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count(); }

}  // namespace

int main(int argc, char** argv) {
  int64_t n = 4096, k = 4096, tokens = 4096;
  std::string json;
  bool sparse = true;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto next = [&]() -> const char* {
      if (i + 1 >= argc) { std::fprintf(stderr, "missing value after %s\n", a.c_str()); std::exit(2); }
      return argv[++i];
    };
    if (a == "--n") n = std::atoll(next());
    else if (a == "--k") k = std::atoll(next());
    else if (a == "--tokens") tokens = std::atoll(next());
    else if (a == "--json") json = next();
    else if (a == "--skip-sparse") sparse = false;
    else { std::fprintf(stderr, "unknown argument %s\n", a.c_str()); return 2; }
  }
  std::mt19937_64 rng(1);
  std::student_t_distribution<float> t4(4.0f);
  std::normal_distribution<float> nd;
  std::vector<float> W(size_t(n * k)), X(size_t(tokens * k));
  for (auto& w : W) w = 0.01f * t4(rng);
  for (auto& x : X) x = nd(rng);

  struct Row { std::string what; double seconds; double loss; };
  std::vector<Row> rows;
  double t0 = now();
  HessianAccumulator acc(k);
  // Variable-length samples of 1..512 tokens.
  for (int64_t s = 0, len = 1; s < tokens; len = len * 7 % 509 + 3) {
    const int64_t t = std::min(len, tokens - s);
    acc.add(X.data() + s * k, t);
    s += t;
  }
  const Eigen::MatrixXf H = acc.finalize();
  rows.push_back({"hessian (" + std::to_string(tokens) + " tokens)", now() - t0, 0});

  RtnStats rs;
  RtnOptions ro;
  rtn_quantize(W.data(), n, k, ro, &rs);
  rows.push_back({"rtn g128", rs.seconds, 0});
  ro.clip = true;
  rtn_quantize(W.data(), n, k, ro, &rs);
  rows.push_back({"rtn g128 + L2.4 clip", rs.seconds, 0});

  GptqOptions o;
  GptqStats st;
  gptq_quantize(W.data(), n, k, H, o, &st);
  rows.push_back({"gptq g128", st.seconds, st.loss});
  o.clip = GptqOptions::Marlin;
  gptq_quantize(W.data(), n, k, H, o, &st);
  rows.push_back({"gptq g128 + marlin clip", st.seconds, st.loss});
  if (sparse) {
    o.sparse24 = true;
    gptq_quantize(W.data(), n, k, H, o, &st);
    rows.push_back({"sparsegpt 2:4 + 4-bit + clip", st.seconds, st.loss});
  }

  std::printf("layer %lld x %lld (n x k), %d OpenMP threads\n", (long long)n, (long long)k, omp_get_max_threads());
  std::printf("%-34s %10s %14s\n", "step", "seconds", "OBS loss");
  for (const Row& r : rows) std::printf("%-34s %10.3f %14.6g\n", r.what.c_str(), r.seconds, r.loss);
  if (!json.empty()) {
    std::ofstream f(json);
    f << "{\"n\": " << n << ", \"k\": " << k << ", \"tokens\": " << tokens << ", \"threads\": " << omp_get_max_threads()
      << ", \"results\": [";
    for (size_t i = 0; i < rows.size(); ++i)
      f << (i ? ", " : "") << "{\"step\": \"" << rows[i].what << "\", \"seconds\": " << rows[i].seconds
        << ", \"loss\": " << rows[i].loss << "}";
    f << "]}\n";
  }
  return 0;
}
