// Property tests for the Marlin / Sparse-Marlin layouts on random shapes and seeds: fast == _ref bit
// for bit, unpack(pack(x)) == x, pack(unpack(B)) == B, and invalid inputs throw marlinc::Error
// naming the rule.
#include <functional>
#include <string>
#include <vector>

#include "checkpoint/error.h"
#include "packer/layout_constants.h"
#include "packer/marlin.h"
#include "tests/common.h"
#include "tests/packer/packer_test_util.h"

using namespace marlinc;
using marlinc::test::Rng;

namespace {
constexpr int kRandomShapes = 12;     // shapes per bit width and layout
constexpr uint64_t kSeed = 0x5eed2024;

bool throws_with(const std::function<void()>& f, const std::string& needle) {
  try {
    f();
  } catch (const Error& e) {
    const std::string w = e.what();
    if (w.find(needle) != std::string::npos) return true;
    FAIL("error message '" << w << "' lacks '" << needle << "'");
  }
  return false;
}
}  // namespace

TEST_CASE("dense Marlin: fast == ref and round trips on random shapes", "[packer][marlin]") {
  Rng r(kSeed);
  for (int bits : {4, 8})
    for (int it = 0; it < kRandomShapes; ++it) {
      const int64_t k = 16 * (1 + r.below(24)), n = 64 * (1 + r.below(6));
      INFO("bits " << bits << " k " << k << " n " << n);
      auto q = test::random_codes(r, k, n, bits);
      auto B = marlin::pack_weights(q.data(), k, n, bits);
      REQUIRE(B.size() == size_t(k / 16 * n * bits / 2));
      CHECK(B == marlin::pack_weights_ref(q.data(), k, n, bits));
      CHECK(B == marlin::pack_weights_table(q.data(), k, n, bits));
      CHECK(marlin::unpack_weights(B.data(), k, n, bits) == q);
      CHECK(marlin::unpack_weights_ref(B.data(), k, n, bits) == q);
      // Every bit pattern of B is a valid packing: pack(unpack(B)) == B.
      auto W = test::random_words(r, B.size());
      auto u = marlin::unpack_weights(W.data(), k, n, bits);
      CHECK(u == marlin::unpack_weights_ref(W.data(), k, n, bits));
      CHECK(marlin::pack_weights(u.data(), k, n, bits) == W);
    }
}

TEST_CASE("dense Marlin: packing is deterministic across thread counts", "[packer][marlin]") {
  Rng r(kSeed + 1);
  const int64_t k = 256, n = 512;
  auto q = test::random_codes(r, k, n, 4);
  auto a = marlin::pack_weights(q.data(), k, n, 4);
  auto b = marlin::pack_weights(q.data(), k, n, 4);
  CHECK(a == b);
}

TEST_CASE("Marlin scales and zero points: round trips, fast == ref", "[packer][marlin]") {
  Rng r(kSeed + 2);
  for (int it = 0; it < kRandomShapes; ++it) {
    const int64_t G = 1 + r.below(5), n = 64 * (1 + r.below(6));
    std::vector<uint16_t> s(size_t(G * n));
    for (auto& x : s) x = uint16_t(r.next());
    INFO("G " << G << " n " << n);
    CHECK(marlin::unpermute_scales(marlin::permute_scales(s.data(), G, n).data(), G, n) == s);
    CHECK(marlin::unpermute_scales_24(marlin::permute_scales_24(s.data(), G, n).data(), G, n) == s);
    auto p24 = marlin::permute_scales_24(s.data(), G, n);
    for (int64_t g = 0; g < G; ++g)
      for (int64_t c = 0; c < n; ++c) {
        // §3.5: grouped column c lands at 64*(c/64) + 8*((c%64)/8) + [0,2,4,6,1,3,5,7][c%8]; G == 1: identity.
        static const int land[8] = {0, 2, 4, 6, 1, 3, 5, 7};
        const int64_t dst = G == 1 ? c : 64 * (c / 64) + 8 * ((c % 64) / 8) + land[c % 8];
        REQUIRE(p24[size_t(g * n + dst)] == s[size_t(g * n + c)]);
      }
    for (int bits : {4, 8}) {
      auto z = test::random_codes(r, G, n, bits);
      auto zp = marlin::pack_zero_points(z.data(), G, n, bits);
      REQUIRE(zp.size() == size_t(G * n * bits / 32));
      CHECK(zp == marlin::pack_zero_points_ref(z.data(), G, n, bits));
      CHECK(marlin::unpack_zero_points(zp.data(), G, n, bits) == z);
      CHECK(marlin::unpack_zero_points_ref(zp.data(), G, n, bits) == z);
    }
  }
}

TEST_CASE("Sparse-Marlin 2:4: fast == ref, round trip, pruned codes never read", "[packer][marlin24]") {
  Rng r(kSeed + 3);
  for (int bits : {4, 8})
    for (int it = 0; it < kRandomShapes; ++it) {
      const int64_t k = 32 * (1 + r.below(10)), n = 64 * (1 + r.below(5));
      INFO("bits " << bits << " k " << k << " n " << n);
      auto m = test::random_mask_24(r, k, n);
      auto q = test::random_codes(r, k, n, bits);
      auto p = marlin::pack_24(q.data(), m.data(), k, n, bits);
      REQUIRE(p.B24.size() == size_t(k / 32 * n * bits / 2));
      REQUIRE(p.meta.size() == size_t(k / 32 * 2 * n));
      auto pr = marlin::pack_24_ref(q.data(), m.data(), k, n, bits);
      CHECK(p.B24 == pr.B24);
      CHECK(p.meta == pr.meta);
      // Garbage (even out-of-range codes) at pruned positions changes nothing.
      auto q2 = q;
      for (size_t i = 0; i < q2.size(); ++i)
        if (!m[i]) q2[i] = uint8_t(r.next());
      auto p2 = marlin::pack_24(q2.data(), m.data(), k, n, bits);
      CHECK(p2.B24 == p.B24);
      CHECK(p2.meta == p.meta);
      // Inverse: kept codes and mask restored; pruned read as the zero code 2^(bits-1).
      std::vector<uint8_t> cq(q.size()), cm(q.size()), rq(q.size()), rm(q.size());
      marlin::unpack_24(p.B24.data(), p.meta.data(), k, n, bits, cq.data(), cm.data());
      marlin::unpack_24_ref(p.B24.data(), p.meta.data(), k, n, bits, rq.data(), rm.data());
      CHECK(cq == rq);
      CHECK(cm == rm);
      CHECK(cm == m);
      bool ok = true;
      for (size_t i = 0; i < q.size(); ++i) ok &= cq[i] == (m[i] ? q[i] : uint8_t(1 << (bits - 1)));
      CHECK(ok);
      // Repacking the unpacked layer reproduces the bytes.
      auto p3 = marlin::pack_24(cq.data(), cm.data(), k, n, bits);
      CHECK(p3.B24 == p.B24);
      CHECK(p3.meta == p.meta);
    }
}

TEST_CASE("Marlin layouts reject invalid inputs with the rule named", "[packer][errors]") {
  std::vector<uint8_t> q(size_t(64 * 128), 3);
  CHECK(throws_with([&] { marlin::pack_weights(q.data(), 40, 128, 4); }, "multiple of 16"));
  CHECK(throws_with([&] { marlin::pack_weights_ref(q.data(), 40, 128, 4); }, "k=40"));
  CHECK(throws_with([&] { marlin::pack_weights(q.data(), 64, 96, 4); }, "n=96 must be a positive multiple of 64"));
  CHECK(throws_with([&] { marlin::unpack_weights(reinterpret_cast<const int32_t*>(q.data()), 64, 32, 4); }, "n=32"));
  CHECK(throws_with([&] { marlin::pack_weights(q.data(), 64, 128, 3); }, "bits=3"));
  q[size_t(5 * 128 + 7)] = 16;
  CHECK(throws_with([&] { marlin::pack_weights(q.data(), 64, 128, 4); }, "code 16 at (5, 7) exceeds 15"));
  CHECK(throws_with([&] { marlin::pack_weights_ref(q.data(), 64, 128, 4); }, "code 16 at (5, 7)"));
  CHECK_NOTHROW(marlin::pack_weights(q.data(), 64, 128, 8));  // 16 is a fine 8-bit code
  std::vector<uint8_t> z(128, 16);
  CHECK(throws_with([&] { marlin::pack_zero_points(z.data(), 1, 128, 4); }, "zero point 16"));
  std::vector<uint16_t> s(96);
  CHECK(throws_with([&] { marlin::permute_scales(s.data(), 1, 96); }, "n=96"));
  CHECK(throws_with([&] { marlin::permute_scales(s.data(), 0, 64); }, "groups=0"));

  // 2:4: k % 32, n % 64, masks with != 2 kept, codes > 15 at kept positions, invalid meta nibbles.
  Rng r(kSeed + 4);
  const int64_t k = 64, n = 128;
  auto m = test::random_mask_24(r, k, n);
  auto c = test::random_codes(r, k, n, 4);
  CHECK(throws_with([&] { marlin::pack_24(c.data(), m.data(), 48, n, 4); }, "k=48 must be a positive multiple of 32"));
  CHECK(throws_with([&] { marlin::pack_24(c.data(), m.data(), 32, 96, 4); }, "n=96"));
  auto m3 = m;
  for (int t = 0; t < 4; ++t) m3[size_t((36 + t) * n + 77)] = t < 3;  // rows 36..39 of column 77 keep 3
  CHECK(throws_with([&] { marlin::pack_24(c.data(), m3.data(), k, n, 4); },
                    "keeps 3 of rows 36..39 in column 77"));
  CHECK(throws_with([&] { marlin::pack_24_ref(c.data(), m3.data(), k, n, 4); }, "keeps 3 of rows 36..39 in column 77"));
  auto m1 = m;
  for (int t = 0; t < 4; ++t) m1[size_t((8 + t) * n + 3)] = t == 2;
  CHECK(throws_with([&] { marlin::pack_24(c.data(), m1.data(), k, n, 4); }, "keeps 1 of rows 8..11 in column 3"));
  auto c2 = c;
  int64_t kept_row = -1;
  for (int t = 0; t < 4 && kept_row < 0; ++t)
    if (m[size_t((12 + t) * n + 9)]) kept_row = 12 + t;
  c2[size_t(kept_row * n + 9)] = 20;
  CHECK(throws_with([&] { marlin::pack_24(c2.data(), m.data(), k, n, 4); },
                    "kept code 20 at (" + std::to_string(kept_row) + ", 9) exceeds 15"));
  auto p = marlin::pack_24(c.data(), m.data(), k, n, 4);
  p.meta[5] = int16_t(uint16_t(p.meta[5]) & 0xFFF0u);  // nibble 0: idx0 == idx1 == 0, not a 2:4 pair
  std::vector<uint8_t> oq(size_t(k * n)), om(size_t(k * n));
  CHECK(throws_with([&] { marlin::unpack_24(p.B24.data(), p.meta.data(), k, n, 4, oq.data(), om.data()); },
                    "meta nibble 0x0"));
  // The thrown errors are marlinc::Error with kind BadData (input bytes) or BadUsage (options).
  try {
    marlin::pack_24(c.data(), m3.data(), k, n, 4);
    FAIL("no throw");
  } catch (const Error& e) {
    CHECK(e.kind() == ErrorKind::BadData);
  }
}

TEST_CASE("layout tables agree with the closed forms", "[packer][marlin]") {
  // perm entry p of a 1024-chunk is the tile-local source index; the closed form §1.5 places that
  // element at word p/8, nibble p%8 of the block.
  using namespace marlinc::layout;
  for (int p = 0; p < 1024; ++p) {
    const int o = kWeightPerm4[size_t(p)];
    const int kr = (o % 256) / 16, nr = 16 * (o / 256) + o % 16, j = nr / 16, c16 = nr % 16;
    const int i = 4 * (c16 % 8) + (kr % 8) / 2;
    REQUIRE(p / 8 == 4 * i + j);
    REQUIRE(p % 8 == 4 * (kr % 2) + 2 * (c16 / 8) + kr / 8);
  }
  // Meta column table vs an independent CUTLASS-style derivation: row shuffle of the [n, k/16] meta
  // matrix in 64-row groups, 2x2 swizzle, then ColumnMajorInterleaved<2> addressing (flat = col/2 *
  // 2*rows + dst_row*2 + col%2); with k/16 = c in {0, 1} the flat index is the [k/32, 2n] column.
  const int rows = 64;
  for (int nn = 0; nn < 64; ++nn)
    for (int col = 0; col < 2; ++col) {
      int dr = nn / 64 * 64 + (nn % 2) * 2 + (nn % 8) / 4 + ((nn % 32) % 4) / 2 * 32 + ((nn % 64) / 8) * 4;
      int dc = col;
      const int tr = (dr % 2 == 0 && dc % 2 == 1) ? 1 : 0, bl = (dr % 2 == 1 && dc % 2 == 0) ? 1 : 0;
      dr += tr - bl;
      dc -= tr - bl;
      const int flat = (dc / 2) * rows * 2 + dr * 2 + dc % 2;
      INFO("n " << nn << " k/16 " << col);
      REQUIRE(flat == kMetaCol[size_t(nn)] + 2 * col);
    }
}
