// Packer throughput: fast (table-driven, OpenMP) vs scalar `_ref` layouts on one Llama-3-8B MLP layer
// shape (k = 4096, n = 14336 by default). Prints a table; with --json PATH also writes the numbers.
// Usage: bench_pack [--k K] [--n N] [--reps R] [--json PATH]
#include <omp.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "packer/gptq.h"
#include "packer/marlin.h"

using namespace marlinc;

namespace {

double seconds(const std::function<void()>& f, int reps) {
  double best = 1e30;
  for (int r = 0; r < reps; ++r) {
    const auto t0 = std::chrono::steady_clock::now();
    f();
    best = std::min(best, std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
  return best;
}

struct Row {
  std::string name;
  double ref_s, fast_s, gb;  // gb: bytes of codes moved, in GB
};

}  // namespace

int main(int argc, char** argv) {
  int64_t k = 4096, n = 14336;
  int reps = 3;
  const char* json = nullptr;
  for (int i = 1; i + 1 < argc; i += 2) {
    if (!std::strcmp(argv[i], "--k")) k = std::atoll(argv[i + 1]);
    else if (!std::strcmp(argv[i], "--n")) n = std::atoll(argv[i + 1]);
    else if (!std::strcmp(argv[i], "--reps")) reps = std::atoi(argv[i + 1]);
    else if (!std::strcmp(argv[i], "--json")) json = argv[i + 1];
  }
  std::mt19937_64 g(42);
  std::vector<uint8_t> codes(size_t(k * n)), mask(size_t(k * n), 0);  // [k, n]
  for (auto& c : codes) c = uint8_t(g() & 15);
  for (int64_t grp = 0; grp < k / 4; ++grp)
    for (int64_t c = 0; c < n; ++c) {
      const int a = int(g() % 4), b = (a + 1 + int(g() % 3)) % 4;
      mask[size_t((4 * grp + a) * n + c)] = mask[size_t((4 * grp + b) * n + c)] = 1;
    }
  const double gb = double(k * n) / 1e9;
  std::vector<Row> rows;
  volatile size_t sink = 0;
  auto B = marlin::pack_weights(codes.data(), k, n, 4);
  auto qw = gptq::pack_qweight(codes.data(), k, n, 4);
  rows.push_back({"marlin 4-bit pack",
                  seconds([&] { sink = sink + marlin::pack_weights_ref(codes.data(), k, n, 4).size(); }, 1),
                  seconds([&] { sink = sink + marlin::pack_weights(codes.data(), k, n, 4).size(); }, reps), gb});
  rows.push_back({"marlin 4-bit unpack",
                  seconds([&] { sink = sink + marlin::unpack_weights_ref(B.data(), k, n, 4).size(); }, 1),
                  seconds([&] { sink = sink + marlin::unpack_weights(B.data(), k, n, 4).size(); }, reps), gb});
  rows.push_back({"marlin 8-bit pack",
                  seconds([&] { sink = sink + marlin::pack_weights_ref(codes.data(), k, n, 8).size(); }, 1),
                  seconds([&] { sink = sink + marlin::pack_weights(codes.data(), k, n, 8).size(); }, reps), gb});
  rows.push_back({"marlin 2:4 pack",
                  seconds([&] { sink = sink + marlin::pack_24_ref(codes.data(), mask.data(), k, n, 4).B24.size(); }, 1),
                  seconds([&] { sink = sink + marlin::pack_24(codes.data(), mask.data(), k, n, 4).B24.size(); }, reps), gb});
  rows.push_back({"gptq qweight pack",
                  seconds([&] { sink = sink + gptq::pack_qweight_ref(codes.data(), k, n, 4).size(); }, 1),
                  seconds([&] { sink = sink + gptq::pack_qweight(codes.data(), k, n, 4).size(); }, reps), gb});
  rows.push_back({"gptq qweight unpack",
                  seconds([&] { sink = sink + gptq::unpack_qweight_ref(qw.data(), k, n, 4).size(); }, 1),
                  seconds([&] { sink = sink + gptq::unpack_qweight(qw.data(), k, n, 4).size(); }, reps), gb});
  rows.push_back({"gptq->marlin (unpack+pack)", 0.0,
                  seconds([&] {
                    auto c = gptq::unpack_qweight(qw.data(), k, n, 4);
                    sink = sink + marlin::pack_weights(c.data(), k, n, 4).size();
                  }, reps), gb});
  rows.push_back({"gptq->marlin fused", 0.0,
                  seconds([&] { sink = sink + marlin::pack_weights_from_qweight(qw.data(), k, n, 4).size(); }, reps), gb});
  rows.push_back({"marlin->gptq fused", 0.0,
                  seconds([&] { sink = sink + marlin::unpack_weights_to_qweight(B.data(), k, n, 4).size(); }, reps), gb});
  rows.push_back({"memcpy of qweight bytes", 0.0,
                  seconds([&] {
                    std::vector<int32_t> c(qw.size());
                    std::memcpy(c.data(), qw.data(), qw.size() * 4);
                    sink = sink + size_t(c[c.size() / 2]);
                  }, reps), gb});
  rows.push_back({"ct weight_packed pack",
                  seconds([&] { sink = sink + ct::pack_weight_ref(codes.data(), k, n, 4).size(); }, 1),
                  seconds([&] { sink = sink + ct::pack_weight(codes.data(), k, n, 4).size(); }, reps), gb});

  std::printf("bench_pack  k=%lld n=%lld  threads=%d  (best of %d for fast, 1 run for ref)\n", (long long)k,
              (long long)n, omp_get_max_threads(), reps);
  std::printf("%-28s %10s %10s %8s %12s\n", "layout", "ref ms", "fast ms", "speedup", "fast Gcode/s");
  for (const Row& r : rows)
    std::printf("%-28s %10.1f %10.1f %8.1f %12.2f\n", r.name.c_str(), r.ref_s * 1e3, r.fast_s * 1e3,
                r.ref_s > 0 ? r.ref_s / r.fast_s : 0.0, r.gb / r.fast_s);
  if (json) {
    FILE* f = std::fopen(json, "w");
    if (!f) {
      std::fprintf(stderr, "bench_pack: cannot write %s\n", json);
      return 1;
    }
    std::fprintf(f, "{\"k\": %lld, \"n\": %lld, \"threads\": %d, \"results\": [", (long long)k, (long long)n,
                 omp_get_max_threads());
    for (size_t i = 0; i < rows.size(); ++i)
      std::fprintf(f, "%s{\"layout\": \"%s\", \"ref_ms\": %.3f, \"fast_ms\": %.3f}", i ? ", " : "",
                   rows[i].name.c_str(), rows[i].ref_s * 1e3, rows[i].fast_s * 1e3);
    std::fprintf(f, "]}\n");
    std::fclose(f);
  }
  return 0;
}
