// Hessian accumulation over variable-length samples, normalisation, save/load and corrupted files.
#include <fstream>

#include "checkpoint/error.h"
#include "checkpoint/half.h"
#include "quantizer/hessian.h"
#include "tests/catch.hpp"
#include "tests/common.h"
#include "tests/quantizer/synth.h"

namespace {

using namespace marlinc;

// fp32 sums of a few hundred tokens against an fp64 reference.
constexpr double kHessRelTol = 1e-5;

test::RowMatF random_tokens(int64_t t, int64_t k, uint64_t seed) {
  test::Normal g(seed);
  test::RowMatF X(t, k);
  for (int64_t i = 0; i < X.size(); ++i) X.data()[i] = float(g());
  for (int64_t c = 0; c < k; c += 17) X.col(c) *= 8.0f;
  return X;
}

double rel_diff(const Eigen::MatrixXf& a, const Eigen::MatrixXd& b) { return (a.cast<double>() - b).norm() / b.norm(); }

void write_bytes(const std::filesystem::path& p, const std::vector<char>& b) {
  std::ofstream f(p, std::ios::binary | std::ios::trunc);
  f.write(b.data(), std::streamsize(b.size()));
}
std::vector<char> read_bytes(const std::filesystem::path& p) {
  std::ifstream f(p, std::ios::binary);
  return std::vector<char>(std::istreambuf_iterator<char>(f), {});
}

}  // namespace

TEST_CASE("Hessian of variable-length samples equals the concatenated computation", "[quantizer][hessian]") {
  const int64_t k = 300, N = 517;  // k not a multiple of the 128-column panel
  const test::RowMatF X = random_tokens(N, k, 21);
  const Eigen::MatrixXd ref = hessian_ref(X.data(), N, k);
  HessianAccumulator acc(k);
  const int64_t lens[] = {1, 0, 200, 3, 64, 249};  // sums to 517, includes an empty sample
  int64_t t0 = 0;
  for (int64_t t : lens) {
    acc.add(X.data() + t0 * k, t);
    t0 += t;
  }
  REQUIRE(t0 == N);
  CHECK(acc.tokens() == N);
  CHECK(acc.samples() == 6);
  const Eigen::MatrixXf H = acc.finalize();
  CHECK(rel_diff(H, ref) < kHessRelTol);
  CHECK((H - H.transpose()).norm() == 0.0f);  // exactly symmetric
  // Token weighting: H = (2/N)·Σxxᵀ, so its diagonal is twice the mean square of each channel.
  const double ms0 = X.col(0).cast<double>().squaredNorm() / double(N);
  CHECK(std::fabs(H(0, 0) - 2 * ms0) / (2 * ms0) < kHessRelTol);

  HessianAccumulator one(k);
  one.add(X.data(), N);
  CHECK(rel_diff(one.finalize(), ref) < kHessRelTol);
}

TEST_CASE("Hessian from fp16 / bf16 activations matches the fp32 path on the same values", "[quantizer][hessian]") {
  const int64_t k = 96, N = 600;  // more rows than one conversion chunk
  test::RowMatF X = random_tokens(N, k, 4);
  std::vector<uint16_t> h(size_t(N * k)), b(size_t(N * k));
  for (int64_t i = 0; i < N * k; ++i) {
    h[size_t(i)] = float_to_half(X.data()[i]);
    b[size_t(i)] = float_to_bf16(X.data()[i]);
  }
  test::RowMatF Xh(N, k), Xb(N, k);
  for (int64_t i = 0; i < N * k; ++i) {
    Xh.data()[i] = half_to_float(h[size_t(i)]);
    Xb.data()[i] = bf16_to_float(b[size_t(i)]);
  }
  HessianAccumulator ah(k), ab(k);
  ah.add_f16(h.data(), N);
  ab.add_bf16(b.data(), N);
  CHECK(ah.samples() == 1);
  CHECK(ah.tokens() == N);
  CHECK(rel_diff(ah.finalize(), hessian_ref(Xh.data(), N, k)) < kHessRelTol);
  CHECK(rel_diff(ab.finalize(), hessian_ref(Xb.data(), N, k)) < kHessRelTol);
}

TEST_CASE("Hessian accumulator rejects misuse", "[quantizer][hessian]") {
  HessianAccumulator acc(8);
  CHECK(test::throws_with([&] { acc.finalize(); }, {"no calibration token"}));
  std::vector<float> x(16, 1.0f);
  x[11] = INFINITY;
  CHECK(test::throws_with([&] { acc.add(x.data(), 2); }, {"token 1", "channel 3", "not finite"}));
  CHECK_THROWS_AS(HessianAccumulator(0), marlinc::Error);
}

TEST_CASE("Hessian save/load round trip resumes accumulation, corrupted files are refused", "[quantizer][hessian]") {
  test::TempDir dir("hessian");
  const int64_t k = 40;
  const test::RowMatF X = random_tokens(50, k, 8);
  HessianAccumulator acc(k);
  acc.add(X.data(), 20);
  const auto path = dir.path / "qkv.hess";
  acc.save(path);
  HessianAccumulator back = HessianAccumulator::load(path);
  CHECK(back.k() == k);
  CHECK(back.tokens() == 20);
  CHECK(back.samples() == 1);
  CHECK(back.sum() == acc.sum());
  // Resuming after a load gives the same result as never stopping.
  back.add(X.data() + 20 * k, 30);
  acc.add(X.data() + 20 * k, 30);
  CHECK(back.finalize() == acc.finalize());

  const std::vector<char> good = read_bytes(path);
  REQUIRE(good.size() == 48 + size_t(k * k) * 4);
  const auto bad = dir.path / "bad.hess";
  auto expect_bad = [&](std::vector<char> bytes, const char* rule) {
    write_bytes(bad, bytes);
    bool kind_ok = false;
    try {
      HessianAccumulator::load(bad);
    } catch (const marlinc::Error& e) {
      kind_ok = e.kind() == ErrorKind::BadData && std::string(e.what()).find("bad.hess") != std::string::npos &&
                std::string(e.what()).find(rule) != std::string::npos;
    }
    CHECK(kind_ok);
  };
  expect_bad(std::vector<char>(good.begin(), good.begin() + 20), "shorter than the 48-byte header");
  expect_bad(std::vector<char>(good.begin(), good.end() - 4), "truncated");
  auto b = good;
  b[0] = 'X';
  expect_bad(b, "bad magic");
  b = good;
  b[8] = 9;
  expect_bad(b, "version");
  b = good;
  b[100] ^= 0x10;
  expect_bad(b, "checksum");
  b = good;
  b[16] = 0;  // k = 0 (little-endian int64 at offset 16; k=40 fits in the first byte)
  expect_bad(b, "k=0");
  CHECK(test::throws_with([&] { HessianAccumulator::load(dir.path / "missing.hess"); }, {"missing.hess"}));
}
