// CPU reference GEMM on Marlin-packed bytes (kernels/reference_gemm.h): layout decoding against the
// spec's worked examples, the fast path bit-exact to the scalar one, agreement with a direct
// computation from codes, and the golden files of the original packer.
#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "checkpoint/error.h"
#include "checkpoint/half.h"
#include "checkpoint/safetensors.h"
#include "kernels/reference_gemm.h"
#include "packer/marlin.h"
#include "tests/common.h"

using namespace marlinc;
using namespace marlinc::kernels;

namespace {

constexpr uint32_t kSeed = 20261122;
// The fast and scalar reference sum the same double products in the same order: bit-identical.
constexpr double kExactTol = 0.0;

struct Problem {
  int64_t m, k, n, group;
  ActType act;
  std::vector<uint16_t> A;     // [m, k]
  std::vector<uint8_t> q;      // [k, n] codes 0..15
  std::vector<uint16_t> s_in;  // [G, n] plain scales
  std::vector<int32_t> B;      // [k/16, 2n]
  std::vector<uint16_t> s;     // [G, n] permuted
  RefGemmProblem view() const { return {A.data(), B.data(), s.data(), m, n, k, group, act}; }
};

uint16_t to_act(float v, ActType t) { return t == ActType::F16 ? float_to_half(v) : float_to_bf16(v); }
double from_act(uint16_t v, ActType t) { return t == ActType::F16 ? half_to_float(v) : bf16_to_float(v); }

Problem make_problem(std::mt19937& rng, int64_t m, int64_t k, int64_t n, int64_t group, ActType act) {
  Problem p{m, k, n, group, act, {}, {}, {}, {}, {}};
  const int64_t G = group == -1 ? 1 : k / group;
  std::normal_distribution<float> nd(0.f, 1.f);
  std::uniform_int_distribution<int> code(0, 15);
  std::uniform_real_distribution<float> sd(0.002f, 0.02f);
  p.A.resize(size_t(m * k));
  for (auto& v : p.A) v = to_act(nd(rng), act);
  p.q.resize(size_t(k * n));
  for (auto& v : p.q) v = uint8_t(code(rng));
  p.s_in.resize(size_t(G * n));
  for (auto& v : p.s_in) v = to_act(sd(rng), act);
  p.B = marlin::pack_weights(p.q.data(), k, n, 4);
  p.s = marlin::permute_scales(p.s_in.data(), G, n);
  return p;
}

// Direct computation from the unpacked codes and plain scales, independent of any unpacker.
std::vector<double> direct(const Problem& p) {
  const int64_t g = p.group == -1 ? p.k : p.group;
  std::vector<double> C(size_t(p.m * p.n));
  for (int64_t r = 0; r < p.m; ++r)
    for (int64_t c = 0; c < p.n; ++c) {
      double acc = 0;
      for (int64_t kk = 0; kk < p.k; ++kk) {
        const float w = float(double(int(p.q[size_t(kk * p.n + c)]) - 8) * from_act(p.s_in[size_t((kk / g) * p.n + c)], p.act));
        acc += from_act(p.A[size_t(r * p.k + kk)], p.act) * double(w);
      }
      C[size_t(r * p.n + c)] = acc;
    }
  return C;
}

double max_abs_diff(const std::vector<double>& a, const std::vector<double>& b) {
  REQUIRE(a.size() == b.size());
  double d = 0;
  for (size_t i = 0; i < a.size(); ++i) d = std::max(d, std::fabs(a[i] - b[i]));
  return d;
}

}  // namespace

TEST_CASE("dequantize_ref decodes the spec's worked positions", "[kernels][reference]") {
  // k = 48, n = 256: every code 8 (weight 0) except one planted code per case.
  const int64_t k = 48, n = 256;
  struct Case { int64_t row, word; int nibble; int64_t kk, nn; };
  // (k, n) -> (row, word, nibble) from formats.md §1.5.
  const Case cases[] = {{0, 0, 0, 0, 0},  {0, 0, 4, 1, 0},     {0, 0, 1, 8, 0},   {0, 0, 7, 9, 8},
                        {0, 4, 0, 2, 0},  {0, 16, 0, 0, 1},    {0, 115, 2, 0, 63}, {0, 88, 6, 5, 13},
                        {2, 392, 6, 37, 200}, {1, 0, 0, 16, 0}};
  std::vector<uint16_t> s_plain(static_cast<size_t>(n));
  for (int64_t c = 0; c < n; ++c) s_plain[size_t(c)] = float_to_half(float(c + 1) / 64.f);
  const std::vector<uint16_t> s = marlin::permute_scales(s_plain.data(), 1, n);
  const std::vector<uint16_t> A(1 * size_t(k), float_to_half(1.f));
  for (const Case& cs : cases) {
    std::vector<int32_t> B(size_t(k / 16 * 2 * n), int32_t(0x88888888u));
    uint32_t& w = reinterpret_cast<uint32_t&>(B[size_t(cs.row * 2 * n + cs.word)]);
    w = (w & ~(0xFu << (4 * cs.nibble))) | (3u << (4 * cs.nibble));  // code 3 -> weight -5 * s
    RefGemmProblem p{A.data(), B.data(), s.data(), 1, n, k, -1, ActType::F16};
    const std::vector<float> W = dequantize_ref(p);
    for (int64_t kk = 0; kk < k; ++kk)
      for (int64_t c = 0; c < n; ++c) {
        const float expect = (kk == cs.kk && c == cs.nn) ? -5.f * float(c + 1) / 64.f : 0.f;
        if (W[size_t(kk * n + c)] != expect) {
          INFO("planted (" << cs.kk << "," << cs.nn << ") found value at (" << kk << "," << c << ")");
          REQUIRE(W[size_t(kk * n + c)] == expect);
        }
      }
  }
}

TEST_CASE("reference_gemm is bit-identical to reference_gemm_ref and to a direct sum", "[kernels][reference]") {
  std::mt19937 rng(kSeed);
  const int64_t groups[] = {-1, 32, 64, 128};
  const ActType acts[] = {ActType::F16, ActType::BF16};
  const int64_t ms[] = {1, 7, 17};
  const int64_t shapes[][2] = {{128, 64}, {256, 192}};
  for (ActType act : acts)
    for (int64_t g : groups)
      for (auto& sh : shapes)
        for (int64_t m : ms) {
          if (g != -1 && sh[0] % g != 0) continue;
          const Problem p = make_problem(rng, m, sh[0], sh[1], g, act);
          INFO("act " << int(act) << " g " << g << " k " << sh[0] << " n " << sh[1] << " m " << m);
          const std::vector<double> fast = reference_gemm(p.view());
          const std::vector<double> slow = reference_gemm_ref(p.view());
          REQUIRE(max_abs_diff(fast, slow) <= kExactTol);
          REQUIRE(max_abs_diff(fast, direct(p)) <= kExactTol);
        }
}

TEST_CASE("reference_gemm computes requested rows only, in the order asked", "[kernels][reference]") {
  std::mt19937 rng(kSeed + 1);
  const Problem p = make_problem(rng, 9, 256, 128, 128, ActType::F16);
  const std::vector<double> all = reference_gemm(p.view());
  const std::vector<int64_t> rows = {8, 0, 3};
  const std::vector<double> some = reference_gemm(p.view(), rows);
  REQUIRE(some.size() == rows.size() * size_t(p.n));
  for (size_t i = 0; i < rows.size(); ++i)
    for (int64_t c = 0; c < p.n; ++c) REQUIRE(some[i * size_t(p.n) + size_t(c)] == all[size_t(rows[i] * p.n + c)]);
  // Not all zero: random data must give a non-trivial product.
  double mag = 0;
  for (double v : all) mag += std::fabs(v);
  REQUIRE(mag > 0.0);
}

TEST_CASE("reference_gemm rejects bad problems with BadUsage", "[kernels][reference]") {
  std::mt19937 rng(kSeed + 2);
  Problem p = make_problem(rng, 2, 128, 64, 64, ActType::F16);
  RefGemmProblem v = p.view();
  v.group_size = 48;  // does not divide k = 128
  REQUIRE_THROWS_AS(reference_gemm(v), Error);
  v = p.view();
  v.n = 96;
  REQUIRE_THROWS_AS(reference_gemm(v), Error);
  v = p.view();
  REQUIRE_THROWS_AS(reference_gemm(v, {2}), Error);
  try {
    v.group_size = 0;
    reference_gemm(v);
    FAIL("group_size 0 accepted");
  } catch (const Error& e) {
    REQUIRE(e.kind() == ErrorKind::BadUsage);
  }
}

TEST_CASE("reference_gemm on the original packer's golden bytes equals q * s_in", "[kernels][reference][golden]") {
  MARLINC_REQUIRE_SHARED();
  std::mt19937 rng(kSeed + 3);
  std::normal_distribution<float> nd(0.f, 1.f);
  const char* names[] = {"marlin_k256_n256_g128", "marlin_k256_n256_g-1", "marlin_k512_n768_g128", "marlin_k1024_n512_g-1"};
  for (const char* name : names) {
    INFO(name);
    const auto f = SafetensorsFile::open(test::shared_dir() / "golden" / (std::string(name) + ".safetensors"));
    const TensorInfo *tq = f.find("q"), *ts_in = f.find("s_in"), *tB = f.find("B"), *ts = f.find("s");
    REQUIRE((tq && ts_in && tB && ts));
    const int64_t k = tq->shape[0], n = tq->shape[1], G = ts->shape[0];
    const int64_t group = G == 1 ? -1 : k / G;
    auto copy = [&](const TensorInfo* t, auto& v) {  // tensors may be unaligned: copy out
      const auto bytes = f.data(*t);
      v.resize(bytes.size() / sizeof(v[0]));
      std::memcpy(v.data(), bytes.data(), bytes.size());
    };
    std::vector<int8_t> q;
    std::vector<uint16_t> s_in, s;
    std::vector<int32_t> B;
    copy(tq, q); copy(ts_in, s_in); copy(tB, B); copy(ts, s);
    const int64_t m = 3;
    std::vector<uint16_t> A(size_t(m * k));
    for (auto& v : A) v = float_to_half(nd(rng));
    RefGemmProblem p{A.data(), B.data(), s.data(), m, n, k, group, ActType::F16};
    const std::vector<double> C = reference_gemm(p);
    const int64_t g = group == -1 ? k : group;
    for (int64_t r = 0; r < m; ++r)
      for (int64_t c = 0; c < n; ++c) {
        double acc = 0;
        for (int64_t kk = 0; kk < k; ++kk)
          acc += double(half_to_float(A[size_t(r * k + kk)])) *
                 double(float(double(q[size_t(kk * n + c)]) * double(half_to_float(s_in[size_t((kk / g) * n + c)]))));
        REQUIRE(C[size_t(r * n + c)] == acc);
      }
  }
}
