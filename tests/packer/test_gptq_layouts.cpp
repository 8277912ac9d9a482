// GPTQ (qweight, qzeros v1/v2, g_idx, act-order), AWQ and compressed-tensors pack-quantized layouts:
// fast == _ref, round trips, v1 <-> v2, GPTQ -> Marlin -> GPTQ, detection, and errors naming the rule.
#include <algorithm>
#include <functional>
#include <string>
#include <vector>

#include "checkpoint/error.h"
#include "packer/gptq.h"
#include "packer/marlin.h"
#include "tests/common.h"
#include "tests/packer/packer_test_util.h"

using namespace marlinc;
using marlinc::test::Rng;

namespace {
constexpr int kRandomShapes = 10;
constexpr uint64_t kSeed = 0x6a7b2025;

using marlinc::test::error_of;
bool contains(const std::string& s, const std::string& needle) { return s.find(needle) != std::string::npos; }
}  // namespace

TEST_CASE("GPTQ qweight: fast == ref and round trips for 2/4/8 bits", "[packer][gptq]") {
  Rng r(kSeed);
  for (int bits : {2, 4, 8})
    for (int it = 0; it < kRandomShapes; ++it) {
      const int64_t pf = 32 / bits, k = pf * (1 + r.below(40)), n = 1 + r.below(300);
      INFO("bits " << bits << " k " << k << " n " << n);
      auto q = test::random_codes(r, k, n, bits);
      auto qw = gptq::pack_qweight(q.data(), k, n, bits);
      REQUIRE(qw.size() == size_t(k / pf * n));
      CHECK(qw == gptq::pack_qweight_ref(q.data(), k, n, bits));
      CHECK(gptq::unpack_qweight(qw.data(), k, n, bits) == q);
      CHECK(gptq::unpack_qweight_ref(qw.data(), k, n, bits) == q);
    }
}

TEST_CASE("GPTQ -> Marlin -> GPTQ restores qweight exactly (4 and 8 bit)", "[packer][gptq]") {
  Rng r(kSeed + 1);
  for (int bits : {4, 8})
    for (int it = 0; it < kRandomShapes; ++it) {
      const int64_t k = 16 * (1 + r.below(20)), n = 64 * (1 + r.below(5));
      const int64_t pf = 32 / bits;
      auto qw = test::random_words(r, size_t(k / pf * n));  // any bits are a valid qweight
      auto codes = gptq::unpack_qweight(qw.data(), k, n, bits);
      auto B = marlin::pack_weights(codes.data(), k, n, bits);
      auto back = gptq::pack_qweight(marlin::unpack_weights(B.data(), k, n, bits).data(), k, n, bits);
      CHECK(back == qw);
      // The fused repack (no intermediate codes) gives the same bytes both ways.
      CHECK(marlin::pack_weights_from_qweight(qw.data(), k, n, bits) == B);
      CHECK(marlin::unpack_weights_to_qweight(B.data(), k, n, bits) == qw);
    }
}

TEST_CASE("GPTQ qzeros: v1/v2 pack, unpack, per-word conversion, detection", "[packer][gptq]") {
  Rng r(kSeed + 2);
  for (int bits : {2, 4, 8})
    for (int it = 0; it < kRandomShapes; ++it) {
      const int64_t pf = 32 / bits, G = 1 + r.below(6), n = pf * (1 + r.below(40));
      INFO("bits " << bits << " G " << G << " n " << n);
      // Zeros in 1..2^bits-2 are representable in both v1 and v2.
      std::vector<uint8_t> z(size_t(G * n));
      for (auto& x : z) x = uint8_t(1 + r.below((1 << bits) - 2));
      auto v1 = gptq::pack_qzeros(z.data(), G, n, bits, gptq::ZeroFormat::V1);
      auto v2 = gptq::pack_qzeros(z.data(), G, n, bits, gptq::ZeroFormat::V2);
      REQUIRE(v1.size() == size_t(G * n / pf));
      CHECK(gptq::unpack_qzeros(v1.data(), G, n, bits, gptq::ZeroFormat::V1) == z);
      CHECK(gptq::unpack_qzeros(v2.data(), G, n, bits, gptq::ZeroFormat::V2) == z);
      CHECK(gptq::qzeros_v1_to_v2(v1.data(), int64_t(v1.size()), bits) == v2);
      CHECK(gptq::qzeros_v2_to_v1(v2.data(), int64_t(v2.size()), bits) == v1);
      // Reading v2 bytes as v1 shifts every zero by one: the label matters, hence detection.
      auto misread = gptq::unpack_qzeros(v2.data(), G, n, bits, gptq::ZeroFormat::V2);
      CHECK(misread == z);
    }
  // Symmetric words of §4.3: 0x77777777 (v1) / 0x88888888 (v2); 8-bit 0x7f7f7f7f / 0x80808080.
  auto s1 = gptq::sym_qzeros(3, 64, 4, gptq::ZeroFormat::V1);
  auto s2 = gptq::sym_qzeros(3, 64, 4, gptq::ZeroFormat::V2);
  REQUIRE(s1.size() == 3 * 8);
  CHECK(uint32_t(s1[0]) == 0x77777777u);
  CHECK(s1[0] == 2004318071);
  CHECK(s2[0] == -2004318072);
  CHECK(gptq::detect_qzeros(s1.data(), 3, 64, 4) == gptq::QzerosKind::SymV1);
  CHECK(gptq::detect_qzeros(s2.data(), 3, 64, 4) == gptq::QzerosKind::SymV2);
  auto e1 = gptq::sym_qzeros(2, 64, 8, gptq::ZeroFormat::V1);
  auto e2 = gptq::sym_qzeros(2, 64, 8, gptq::ZeroFormat::V2);
  CHECK(uint32_t(e1[0]) == 0x7f7f7f7fu);
  CHECK(uint32_t(e2[0]) == 0x80808080u);
  CHECK(gptq::detect_qzeros(e1.data(), 2, 64, 8) == gptq::QzerosKind::SymV1);
  CHECK(gptq::detect_qzeros(e2.data(), 2, 64, 8) == gptq::QzerosKind::SymV2);
  // The sym words are what pack_qzeros writes for z = 8 / 128.
  std::vector<uint8_t> eight(3 * 64, 8);
  CHECK(gptq::pack_qzeros(eight.data(), 3, 64, 4, gptq::ZeroFormat::V1) == s1);
  CHECK(gptq::pack_qzeros(eight.data(), 3, 64, 4, gptq::ZeroFormat::V2) == s2);
  // One different field anywhere -> asymmetric/unknown; a 4-bit v1 word read as 8-bit is not sym.
  auto s3 = s2;
  s3.back() = int32_t(uint32_t(s3.back()) ^ 0x10000000u);
  CHECK(gptq::detect_qzeros(s3.data(), 3, 64, 4) == gptq::QzerosKind::AsymmetricOrUnknown);
  CHECK(gptq::detect_qzeros(s1.data(), 3, 32, 8) == gptq::QzerosKind::AsymmetricOrUnknown);
  CHECK(gptq::detect_qzeros(s1.data(), 0, 64, 4) == gptq::QzerosKind::AsymmetricOrUnknown);
  CHECK(std::string(gptq::to_string(gptq::QzerosKind::SymV1)).find("v1") != std::string::npos);
}

TEST_CASE("GPTQ qzeros errors: v1 underflow, overflowed v1 files, carries in conversion", "[packer][gptq][errors]") {
  std::vector<uint8_t> z(16, 5);
  z[11] = 0;
  auto msg = error_of([&] { gptq::pack_qzeros(z.data(), 2, 8, 4, gptq::ZeroFormat::V1); });
  CHECK(contains(msg, "zero point 0 at (group 1, column 3)"));
  CHECK(contains(msg, "gptq_v2"));
  CHECK_NOTHROW(gptq::pack_qzeros(z.data(), 2, 8, 4, gptq::ZeroFormat::V2));
  const int32_t bad_v1[1] = {int32_t(0x777F7777u)};  // field 4 is 15: v1 says z = 16
  msg = error_of([&] { gptq::unpack_qzeros(bad_v1, 1, 8, 4, gptq::ZeroFormat::V1); });
  CHECK(contains(msg, "column 4"));
  CHECK(contains(msg, "z=16"));
  msg = error_of([&] { gptq::qzeros_v1_to_v2(bad_v1, 1, 4); });
  CHECK(contains(msg, "field 4 = 15 would overflow"));
  const int32_t v2_zero[1] = {int32_t(0x88880888u)};
  msg = error_of([&] { gptq::qzeros_v2_to_v1(v2_zero, 1, 4); });
  CHECK(contains(msg, "field 3 = 0 would underflow"));
  CHECK(contains(error_of([&] { gptq::pack_qzeros(z.data(), 2, 6, 4, gptq::ZeroFormat::V2); }), "n=6"));
  CHECK(contains(error_of([&] { gptq::pack_qweight(z.data(), 4, 4, 4); }), "k=4 must be a positive multiple of 8"));
  CHECK(contains(error_of([&] { gptq::pack_qweight(z.data(), 8, 2, 3); }), "bits=3"));
  std::vector<uint8_t> big(16, 1);
  big[9] = 17;
  CHECK(contains(error_of([&] { gptq::pack_qweight(big.data(), 8, 2, 4); }), "code 17 at (4, 1) exceeds 15"));
}

TEST_CASE("g_idx: trivial, validation, stable act-order sort, row gather", "[packer][gptq]") {
  auto t = gptq::trivial_g_idx(10, 4);
  CHECK(t == std::vector<int32_t>{0, 0, 0, 0, 1, 1, 1, 1, 2, 2});
  CHECK(gptq::is_trivial_g_idx(t.data(), 10, 4));
  CHECK(gptq::trivial_g_idx(3, -1) == std::vector<int32_t>{0, 0, 0});
  t[5] = 0;
  CHECK_FALSE(gptq::is_trivial_g_idx(t.data(), 10, 4));
  t[5] = 3;
  CHECK(contains(error_of([&] { gptq::validate_g_idx(t.data(), 10, 3); }), "g_idx[5] = 3 outside [0, 3)"));

  // Act-order: ties keep the original row order, so the permutation is unique and deterministic.
  const std::vector<int32_t> g = {2, 0, 1, 0, 2, 1, 0, 2};
  auto a = gptq::act_order_sort(g.data(), 8);
  CHECK(a.sort_indices == std::vector<int32_t>{1, 3, 6, 2, 5, 0, 4, 7});
  CHECK(a.g_idx_sorted == std::vector<int32_t>{0, 0, 0, 1, 1, 2, 2, 2});
  Rng r(kSeed + 3);
  for (int it = 0; it < kRandomShapes; ++it) {
    const int64_t k = 16 * (1 + r.below(16)), G = 1 + r.below(8), n = 64;
    std::vector<int32_t> gi(static_cast<size_t>(k));
    for (auto& x : gi) x = int32_t(r.below(G));
    auto s = gptq::act_order_sort(gi.data(), k);
    CHECK(std::is_sorted(s.g_idx_sorted.begin(), s.g_idx_sorted.end()));
    for (int64_t j = 1; j < k; ++j)
      if (s.g_idx_sorted[size_t(j)] == s.g_idx_sorted[size_t(j - 1)])
        REQUIRE(s.sort_indices[size_t(j)] > s.sort_indices[size_t(j - 1)]);
    auto inv = gptq::invert_permutation(s.sort_indices.data(), k);
    for (int64_t j = 0; j < k; ++j) REQUIRE(inv[size_t(s.sort_indices[size_t(j)])] == j);
    // GPTQ act-order -> Marlin with sort_indices: Marlin row j is GPTQ row sort_indices[j], and
    // gathering back with the inverse restores the GPTQ qweight exactly.
    auto q = test::random_codes(r, k, n, 4);
    auto qm = gptq::gather_rows(q.data(), k, n, s.sort_indices.data());
    auto B = marlin::pack_weights(qm.data(), k, n, 4);
    auto um = marlin::unpack_weights(B.data(), k, n, 4);
    for (int64_t j = 0; j < k; ++j)
      REQUIRE(std::equal(um.begin() + j * n, um.begin() + (j + 1) * n, q.begin() + s.sort_indices[size_t(j)] * n));
    auto qwp = gptq::pack_qweight(q.data(), k, n, 4);
    CHECK(marlin::pack_weights_from_qweight(qwp.data(), k, n, 4, s.sort_indices.data()) == B);
    auto q8 = test::random_codes(r, k, n, 8);
    auto qw8 = gptq::pack_qweight(q8.data(), k, n, 8);
    CHECK(marlin::pack_weights_from_qweight(qw8.data(), k, n, 8, s.sort_indices.data()) ==
          marlin::pack_weights(gptq::gather_rows(q8.data(), k, n, s.sort_indices.data()).data(), k, n, 8));
    auto restored = gptq::gather_rows(um.data(), k, n, inv.data());
    CHECK(gptq::pack_qweight(restored.data(), k, n, 4) == gptq::pack_qweight(q.data(), k, n, 4));
  }
  const std::vector<int32_t> dup = {0, 1, 1, 3};
  CHECK(contains(error_of([&] { gptq::invert_permutation(dup.data(), 4); }), "entry 2 = 1 repeats"));
}

TEST_CASE("AWQ: order map, fast == ref, round trips", "[packer][awq]") {
  // §5: column n sits in word n/8 at nibble [0,4,1,5,2,6,3,7][n%8].
  const int slot[8] = {0, 4, 1, 5, 2, 6, 3, 7};
  for (int c = 0; c < 16; ++c) {
    std::vector<uint8_t> v(16, 0);
    v[size_t(c)] = 1;
    auto p = awq::pack_qweight(v.data(), 1, 16, 4);
    test::Field f = test::single_field(p, 2, 4);
    REQUIRE(f.found);
    CHECK(f.word == c / 8);
    CHECK(f.slot == slot[c % 8]);
  }
  Rng r(kSeed + 4);
  for (int bits : {4, 8})
    for (int it = 0; it < kRandomShapes; ++it) {
      const int64_t rows = 1 + r.below(100), n = (32 / bits) * (1 + r.below(40));
      auto q = test::random_codes(r, rows, n, bits);
      auto p = awq::pack_cols(q.data(), rows, n, bits);
      CHECK(p == awq::pack_cols_ref(q.data(), rows, n, bits));
      CHECK(awq::unpack_cols(p.data(), rows, n, bits) == q);
      CHECK(awq::unpack_cols_ref(p.data(), rows, n, bits) == q);
      CHECK(awq::unpack_qzeros(awq::pack_qzeros(q.data(), rows, n, bits).data(), rows, n, bits) == q);
    }
  // AWQ -> Marlin: unpacked codes repack to Marlin and back to the same AWQ words.
  const int64_t k = 128, n = 128;
  auto q = test::random_codes(r, k, n, 4);
  auto aw = awq::pack_qweight(q.data(), k, n, 4);
  auto B = marlin::pack_weights(awq::unpack_qweight(aw.data(), k, n, 4).data(), k, n, 4);
  CHECK(awq::pack_qweight(marlin::unpack_weights(B.data(), k, n, 4).data(), k, n, 4) == aw);
  CHECK(contains(error_of([&] { awq::pack_cols(q.data(), 2, 12, 4); }), "n=12"));
}

TEST_CASE("compressed-tensors pack-quantized: weight_packed and zero points", "[packer][ct]") {
  Rng r(kSeed + 5);
  for (int bits : {4, 8})
    for (int it = 0; it < kRandomShapes; ++it) {
      const int64_t pf = 32 / bits, k = 1 + r.below(200), n = 1 + r.below(150);
      INFO("bits " << bits << " k " << k << " n " << n);
      auto q = test::random_codes(r, k, n, bits);
      auto p = ct::pack_weight(q.data(), k, n, bits);
      const int64_t kw = (k + pf - 1) / pf;
      REQUIRE(p.size() == size_t(n * kw));
      CHECK(p == ct::pack_weight_ref(q.data(), k, n, bits));
      CHECK(ct::unpack_weight(p.data(), k, n, bits) == q);
      CHECK(ct::unpack_weight_ref(p.data(), k, n, bits) == q);
      // The last word of each row is zero-padded past k.
      if (k % pf) {
        bool pad_zero = true;
        for (int64_t o = 0; o < n; ++o) pad_zero &= (uint32_t(p[size_t(o * kw + kw - 1)]) >> (bits * (k % pf))) == 0;
        CHECK(pad_zero);
      }
      // weight_packed.T is GPTQ qweight when k divides evenly (§2.4).
      if (k % pf == 0) {
        auto qw = gptq::pack_qweight(q.data(), k, n, bits);
        bool transposed = true;
        for (int64_t w = 0; w < kw; ++w)
          for (int64_t o = 0; o < n; ++o) transposed &= qw[size_t(w * n + o)] == p[size_t(o * kw + w)];
        CHECK(transposed);
      }
      const int64_t G = 1 + r.below(5);
      auto z = test::random_codes(r, G, n, bits);
      auto zp = ct::pack_zero_point(z.data(), G, n, bits);
      REQUIRE(zp.size() == size_t((n + pf - 1) / pf * G));
      CHECK(ct::unpack_zero_point(zp.data(), G, n, bits) == z);
    }
  // Zero point of (group g, output o) at word (o/8, g), nibble o%8: [ceil(n/8), G] packed along n.
  std::vector<uint8_t> z(3 * 20, 0);
  z[size_t(2 * 20 + 13)] = 5;
  auto zp = ct::pack_zero_point(z.data(), 3, 20, 4);
  REQUIRE(zp.size() == 3 * 3);
  test::Field f = test::single_field(zp, 3, 4);
  REQUIRE(f.found);
  CHECK(f.row == 1);
  CHECK(f.word == 2);
  CHECK(f.slot == 5);
  CHECK(f.value == 5u);
}
