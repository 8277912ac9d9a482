// verify's arithmetic check on the GPU (verify/gpu_gemm.cu): fp16- and bf16-scaled layers (per-channel,
// grouped, act-order, 2:4) run through our Marlin kernel of their type, against the float64 reference,
// and the kernel's outputs agree with the CPU path's emulation of its numerics (verify/arith.cpp), which
// machines without a GPU rely on.
#include <cmath>
#include <string>
#include <utility>
#include <vector>

#include "tests/common.h"
#include "tests/verify/arith_fixture.h"
#include "verify/arith.h"
#include "verify/gpu_gemm.h"
#include "verify/verify.h"

using namespace marlinc;

namespace {
// Kernel against the CPU emulation, mean|C_gpu - C_cpu| / mean|R|. The two differ only in the order
// of the fp32 sums, which moves an output by one 16-bit ulp where the sums straddle a rounding
// boundary: about 1e-5 for these sizes. An emulation that rounded the weights or the output in the
// other type would differ by 1e-4-2e-3 (the two types' errors against R, tests/verify/test_arith.cpp).
constexpr double kEmulationTol = 1e-4;

// Skips the running test (saying why) on a machine without a CUDA device.
#define MARLINC_REQUIRE_GPU()                   \
  do {                                          \
    std::string device_;                        \
    if (!gpu_available(device_)) {              \
      WARN("skipped: no CUDA device");          \
      return;                                   \
    }                                           \
  } while (0)

// gpu_arith on m random activation rows, for a layer it must refuse: the reason it gives.
std::string gpu_refusal(const QuantizedLinear& q, int m, uint64_t seed) {
  const std::vector<int> batches = {m};
  std::vector<float> C;
  std::vector<double> R;
  std::string why;
  CHECK_FALSE(gpu_arith(q.name, q, random_activations(m, q.k, seed, false), batches, C, R, why));
  return why;
}
}  // namespace

TEST_CASE("verify on the GPU: each layer runs the kernel of its scale type and matches the CPU numerics",
          "[gpu][verify]") {
  MARLINC_REQUIRE_GPU();
  const std::vector<int> batches = {1, 13, 67};
  const VerifyTolerances tol;
  for (int group : {128, -1, 0, 24})  // 0: act-order g_idx over groups of 64; 24: 2:4 sparse, group 128
    for (bool bf16 : {false, true}) {
      // bf16 with large scales: outputs past fp16's range, which only the bf16 kernel holds.
      QuantizedLinear q = test::random_arith_layer(1024, 512, group == 0 ? 64 : group == 24 ? 128 : group, bf16,
                                                   bf16 ? 2048.f : 0.01f, 9);
      if (group == 0) test::make_act_order(q, 10 + uint64_t(bf16));
      if (group == 24) test::make_24(q, 12 + uint64_t(bf16));
      std::vector<std::vector<uint16_t>> As;
      std::vector<uint16_t> stacked;
      for (size_t i = 0; i < batches.size(); ++i) {
        As.push_back(random_activations(batches[i], q.k, 100 + i, bf16));
        stacked.insert(stacked.end(), As.back().begin(), As.back().end());
      }
      std::vector<float> C;
      std::vector<double> R;
      std::string why;
      INFO("group " << group << (bf16 ? ", bf16" : ", fp16"));
      REQUIRE(gpu_arith(q.name, q, stacked, batches, C, R, why));
      std::vector<int64_t> cols;
      for (int64_t c = 0; c < q.n; ++c) cols.push_back(c);
      size_t row = 0;
      for (size_t i = 0; i < batches.size(); ++i) {
        const size_t off = row * size_t(q.n), len = size_t(batches[i]) * size_t(q.n);
        const std::vector<float> got(C.begin() + std::ptrdiff_t(off), C.begin() + std::ptrdiff_t(off + len));
        const std::vector<double> ref(R.begin() + std::ptrdiff_t(off), R.begin() + std::ptrdiff_t(off + len));
        row += size_t(batches[i]);
        const RelErr e = compare(got, ref);
        INFO("m = " << batches[i] << ", mean relative error " << e.mean_rel);
        CHECK(e.finite);
        CHECK(e.mean_rel <= (bf16 ? tol.arith_mean_rel_bf16 : group == 24 ? tol.arith_mean_rel_24 : tol.arith_mean_rel_dense));
        // The reference here is the GPU's DGEMM; the CPU's float64 sums agree to rounding.
        const std::vector<double> cpu_ref = gemm_reference(As[i], batches[i], q, cols);
        double dr = 0, sr = 0;
        for (size_t j = 0; j < len; ++j) dr += std::fabs(cpu_ref[j] - ref[j]), sr += std::fabs(ref[j]);
        CHECK(dr / sr <= 1e-12);
        const std::vector<float> emu = gemm_kernel_numerics(As[i], batches[i], q, cols);
        double de = 0;
        for (size_t j = 0; j < len; ++j) de += std::fabs(double(emu[j]) - double(got[j]));
        INFO("kernel against the CPU emulation: " << de / sr);
        CHECK(de / sr <= kEmulationTol);
      }
    }
}

TEST_CASE("verify on the GPU: act-order groups of unequal sizes stay on the CPU path, saying why", "[gpu][verify]") {
  MARLINC_REQUIRE_GPU();
  QuantizedLinear q = test::random_arith_layer(256, 128, 64, false, 0.01f, 3);
  test::make_act_order(q, 4);
  q.g_idx[0] = (q.g_idx[0] + 1) % 4;  // one group of 64 rows one row short, the next one row long
  CHECK(gpu_refusal(q, 2, 5).find("act-order groups of unequal sizes") != std::string::npos);
}

TEST_CASE("verify on the GPU: widths and depths the kernel cannot take stay on the CPU path, saying why",
          "[gpu][verify]") {
  MARLINC_REQUIRE_GPU();
  // n = 96 (a GPTQ layer may have any width: the packer would refuse it) and k = 96 (not a multiple of 128).
  for (const auto& [k, n] : {std::pair<int64_t, int64_t>{128, 96}, {96, 64}}) {
    INFO("k " << k << " n " << n);
    const QuantizedLinear q = test::random_arith_layer(k, n, 32, false, 0.01f, 4);
    CHECK(gpu_refusal(q, 3, 6).find("the kernel needs n % 64 == 0 and k % 128 == 0") != std::string::npos);
  }
}
