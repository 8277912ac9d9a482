// Every worked example and test vector of formats.md §1.5-§1.8, §3.3, §3.4, §4.2 and §8, checked
// through the real pack functions (fast and _ref). Expected values are the spec's; nothing here is
// computed by the code under test except the results being checked.
#include <cstdio>
#include <string>
#include <vector>

#include "checkpoint/half.h"
#include "packer/crc32.h"
#include "packer/gptq.h"
#include "packer/marlin.h"
#include "tests/common.h"
#include "tests/packer/packer_test_util.h"

using namespace marlinc;
using marlinc::test::Field;
using marlinc::test::single_field;

namespace {

// Shape big enough for every dense worked example, (300, 1000) included.
constexpr int64_t kExK = 320, kExN = 1024;

template <class V>
uint32_t crc_of(const V& v) { return crc32(v.data(), v.size() * sizeof(v[0])); }

std::string hex(uint32_t v) {
  char b[16];
  std::snprintf(b, sizeof b, "0x%08x", v);
  return b;
}

struct Ex { int64_t k, n, row, word; int slot; };

// Dense: code 1 at (k, n) and zeros elsewhere must set exactly (row, word, slot) of B.
void check_dense_example(const Ex& e, int bits) {
  std::vector<uint8_t> q(size_t(kExK * kExN), 0);
  q[size_t(e.k * kExN + e.n)] = 1;
  const int64_t cols = kExN * bits / 2;
  for (int fast = 0; fast < 2; ++fast) {
    auto B = fast ? marlin::pack_weights(q.data(), kExK, kExN, bits) : marlin::pack_weights_ref(q.data(), kExK, kExN, bits);
    Field f = single_field(B, cols, bits);
    INFO("bits " << bits << " (k,n)=(" << e.k << "," << e.n << ") fast=" << fast);
    REQUIRE(f.found);
    CHECK(f.row == e.row);
    CHECK(f.word == e.word);
    CHECK(f.slot == e.slot);
    // Inverse: the unpacked matrix has its only 1 back at (k, n).
    auto back = fast ? marlin::unpack_weights(B.data(), kExK, kExN, bits) : marlin::unpack_weights_ref(B.data(), kExK, kExN, bits);
    CHECK(back == q);
  }
}

}  // namespace

TEST_CASE("crc32 matches zlib's check value", "[packer][spec]") {
  const char* s = "123456789";
  CHECK(crc32(s, 9) == 0xCBF43926u);
  CHECK(crc32(s + 4, 5, crc32(s, 4)) == 0xCBF43926u);  // running form
  CHECK(crc32(s, 0) == 0u);
}

TEST_CASE("spec §1.5: 4-bit element -> (row, word, nibble) worked examples", "[packer][spec]") {
  const Ex ex[] = {{0, 0, 0, 0, 0},     {1, 0, 0, 0, 4},       {8, 0, 0, 0, 1},     {9, 0, 0, 0, 5},
                   {0, 8, 0, 0, 2},     {1, 8, 0, 0, 6},       {8, 8, 0, 0, 3},     {9, 8, 0, 0, 7},
                   {2, 0, 0, 4, 0},     {0, 1, 0, 16, 0},      {0, 7, 0, 112, 0},   {0, 16, 0, 1, 0},
                   {0, 63, 0, 115, 2},  {0, 64, 0, 128, 0},    {16, 0, 1, 0, 0},    {5, 13, 0, 88, 6},
                   {37, 200, 2, 392, 6}, {127, 255, 7, 511, 7}, {300, 1000, 18, 1930, 3}};
  for (const Ex& e : ex) check_dense_example(e, 4);
}

TEST_CASE("spec §1.5: pattern vectors of a single 16x64 block", "[packer][spec]") {
  std::vector<uint8_t> q(16 * 64);
  for (int k = 0; k < 16; ++k)
    for (int n = 0; n < 64; ++n) q[size_t(k * 64 + n)] = uint8_t(k);
  for (int fast = 0; fast < 2; ++fast) {
    auto B = fast ? marlin::pack_weights(q.data(), 16, 64, 4) : marlin::pack_weights_ref(q.data(), 16, 64, 4);
    for (int w = 0; w < 4; ++w) CHECK(uint32_t(B[size_t(w)]) == 0x91918080u);
    for (int w = 4; w < 8; ++w) CHECK(uint32_t(B[size_t(w)]) == 0xb3b3a2a2u);
  }
  for (int k = 0; k < 16; ++k)
    for (int n = 0; n < 64; ++n) q[size_t(k * 64 + n)] = uint8_t(n % 16);
  for (int fast = 0; fast < 2; ++fast) {
    auto B = fast ? marlin::pack_weights(q.data(), 16, 64, 4) : marlin::pack_weights_ref(q.data(), 16, 64, 4);
    for (int w = 0; w < 8; ++w) CHECK(uint32_t(B[size_t(w)]) == 0x88008800u);
  }
}

TEST_CASE("spec §1.6: scale permutation examples", "[packer][spec]") {
  const int64_t n = 256;
  std::vector<uint16_t> s(2 * n);
  for (int g = 0; g < 2; ++g)
    for (int64_t c = 0; c < n; ++c) s[size_t(g * n + c)] = uint16_t(c);  // integer labels stand in for values
  const uint16_t grouped[16] = {0, 8, 16, 24, 32, 40, 48, 56, 1, 9, 17, 25, 33, 41, 49, 57};
  const uint16_t single[16] = {0, 1, 8, 9, 16, 17, 24, 25, 2, 3, 10, 11, 18, 19, 26, 27};
  auto sg = marlin::permute_scales(s.data(), 2, n);
  auto s1 = marlin::permute_scales(s.data(), 1, n);
  for (int t = 0; t < 16; ++t) {
    CHECK(sg[size_t(t)] == grouped[t]);
    CHECK(sg[size_t(n + t)] == grouped[t]);
    CHECK(s1[size_t(t)] == single[t]);
  }
  // Landing formulas: grouped column c -> 64*(c/64) + 8*(c%8) + (c%64)/8; single u=c%32 ->
  // 32*(c/32) + 8*((u%8)/2) + 2*(u/8) + (u%2).
  for (int64_t c = 0; c < n; ++c) {
    CHECK(sg[size_t(64 * (c / 64) + 8 * (c % 8) + (c % 64) / 8)] == c);
    const int64_t u = c % 32;
    CHECK(s1[size_t(32 * (c / 32) + 8 * ((u % 8) / 2) + 2 * (u / 8) + (u % 2))] == c);
  }
}

TEST_CASE("spec §1.7: 8-bit element -> (row, word, byte) worked examples", "[packer][spec]") {
  const Ex ex[] = {{0, 0, 0, 0, 0}, {1, 0, 0, 0, 2}, {8, 0, 0, 0, 1}, {0, 8, 0, 1, 0},
                   {2, 0, 0, 8, 0}, {0, 1, 0, 32, 0}, {0, 16, 0, 2, 0}};
  for (const Ex& e : ex) check_dense_example(e, 8);
}

TEST_CASE("spec §1.8: zero-point column -> (word, nibble) worked examples", "[packer][spec]") {
  const int64_t n = 128;
  const int64_t ex[][3] = {{0, 0, 0}, {1, 1, 0}, {7, 7, 0}, {8, 0, 4}, {9, 1, 4},
                           {16, 0, 1}, {63, 7, 7}, {64, 8, 0}, {72, 8, 4}};
  for (const auto& e : ex) {
    std::vector<uint8_t> z(size_t(n), 0);
    z[size_t(e[0])] = 1;
    for (int fast = 0; fast < 2; ++fast) {
      auto p = fast ? marlin::pack_zero_points(z.data(), 1, n, 4) : marlin::pack_zero_points_ref(z.data(), 1, n, 4);
      Field f = single_field(p, n / 8, 4);
      INFO("column " << e[0] << " fast=" << fast);
      REQUIRE(f.found);
      CHECK(f.word == e[1]);
      CHECK(f.slot == int(e[2]));
    }
  }
}

TEST_CASE("spec §3.3: 2:4 meta (k, n) -> (row, col, shift) worked examples", "[packer][spec]") {
  // Every group keeps rows 0,1 (nibble 0x4) except the target, which keeps rows 2,3 (0xE): the
  // meta differs from the baseline by 0xA << shift at exactly one int16.
  const int64_t k = 128, n = 128;
  const int64_t ex[][5] = {{0, 0, 0, 0, 0},   {4, 0, 0, 0, 4},  {8, 0, 0, 0, 8},  {12, 0, 0, 0, 12},
                           {16, 0, 0, 2, 0},  {32, 0, 1, 0, 0}, {0, 1, 0, 4, 0},  {0, 2, 0, 64, 0},
                           {0, 3, 0, 68, 0},  {0, 4, 0, 1, 0},  {0, 8, 0, 8, 0},  {0, 64, 0, 128, 0},
                           {100, 77, 3, 141, 4}};
  std::vector<uint8_t> q(size_t(k * n), 9), base(size_t(k * n), 0);
  for (int64_t g = 0; g < k / 4; ++g)
    for (int64_t c = 0; c < n; ++c) base[size_t((4 * g) * n + c)] = base[size_t((4 * g + 1) * n + c)] = 1;
  for (int fast = 0; fast < 2; ++fast) {
    auto m0 = fast ? marlin::pack_24(q.data(), base.data(), k, n, 4) : marlin::pack_24_ref(q.data(), base.data(), k, n, 4);
    for (int16_t v : m0.meta) REQUIRE(uint16_t(v) == 0x4444u);
    for (const auto& e : ex) {
      auto m = base;
      const int64_t g0 = e[0] / 4 * 4;
      for (int t = 0; t < 4; ++t) m[size_t((g0 + t) * n + e[1])] = t >= 2;
      auto p = fast ? marlin::pack_24(q.data(), m.data(), k, n, 4) : marlin::pack_24_ref(q.data(), m.data(), k, n, 4);
      std::vector<uint16_t> diff(p.meta.size());
      for (size_t i = 0; i < diff.size(); ++i) diff[i] = uint16_t(p.meta[i] ^ m0.meta[i]);
      Field f = single_field(diff, 2 * n, 4);
      INFO("(k,n)=(" << e[0] << "," << e[1] << ") fast=" << fast);
      REQUIRE(f.found);
      CHECK(f.value == 0xAu);
      CHECK(f.row == e[2]);
      CHECK(f.word == e[3]);
      CHECK(4 * f.slot == int(e[4]));
    }
  }
}

TEST_CASE("spec §3.4: 2:4 compressed (kc, n) -> (row, word, nibble) worked examples", "[packer][spec]") {
  // Mask keeps rows 0,1 of each group, so compressed row kc is original row 4*(kc/2) + kc%2.
  const int64_t k = 64, n = 128;
  const int64_t ex[][5] = {{0, 0, 0, 0, 0},  {1, 0, 0, 0, 4},   {8, 0, 0, 0, 1},  {0, 4, 0, 0, 2},
                           {0, 8, 0, 16, 0}, {0, 1, 0, 1, 0},   {0, 16, 0, 32, 0}, {2, 0, 0, 4, 0},
                           {0, 64, 0, 128, 0}, {16, 0, 1, 0, 0}, {9, 77, 0, 145, 7}};
  std::vector<uint8_t> m(size_t(k * n), 0);
  for (int64_t g = 0; g < k / 4; ++g)
    for (int64_t c = 0; c < n; ++c) m[size_t((4 * g) * n + c)] = m[size_t((4 * g + 1) * n + c)] = 1;
  for (const auto& e : ex) {
    std::vector<uint8_t> q(size_t(k * n), 0);
    q[size_t((4 * (e[0] / 2) + e[0] % 2) * n + e[1])] = 1;
    for (int fast = 0; fast < 2; ++fast) {
      auto p = fast ? marlin::pack_24(q.data(), m.data(), k, n, 4) : marlin::pack_24_ref(q.data(), m.data(), k, n, 4);
      Field f = single_field(p.B24, 2 * n, 4);
      INFO("(kc,n)=(" << e[0] << "," << e[1] << ") fast=" << fast);
      REQUIRE(f.found);
      CHECK(f.row == e[2]);
      CHECK(f.word == e[3]);
      CHECK(f.slot == int(e[4]));
    }
  }
}

TEST_CASE("spec §4.2: GPTQ qweight bit order example", "[packer][spec]") {
  std::vector<uint8_t> q(8 * 8, 0);
  for (int k = 0; k < 8; ++k) q[size_t(k * 8 + 3)] = uint8_t(k % 16);
  auto qw = gptq::pack_qweight(q.data(), 8, 8, 4);
  CHECK(uint32_t(qw[3]) == 0x76543210u);
  CHECK(gptq::pack_qweight_ref(q.data(), 8, 8, 4) == qw);
}

// ---- §8 CRC32 vectors ----------------------------------------------------------------------------
namespace {
std::vector<uint8_t> d_codes(int mod) {
  std::vector<uint8_t> q(256 * 256);
  for (int k = 0; k < 256; ++k)
    for (int n = 0; n < 256; ++n) q[size_t(k * 256 + n)] = uint8_t((7 * k + 3 * n + (k * n) % 11) % mod);
  return q;
}
}  // namespace

TEST_CASE("spec §8 D1/D2/D3: GPTQ and Marlin weight CRCs, and the D1 -> D2 -> D1 chain", "[packer][spec]") {
  const auto q = d_codes(16);
  auto d1 = gptq::pack_qweight(q.data(), 256, 256, 4);
  REQUIRE(d1.size() == 32 * 256);
  CHECK(hex(crc_of(d1)) == "0x30795d0f");
  CHECK(uint32_t(d1[0]) == 0x1a3c5e70u);
  CHECK(uint32_t(d1[1]) == 0xb3b3b3b3u);
  CHECK(uint32_t(d1[2]) == 0xa13a18f6u);
  CHECK(uint32_t(d1[3]) == 0x4a067d39u);
  CHECK(gptq::pack_qweight_ref(q.data(), 256, 256, 4) == d1);

  auto d2 = marlin::pack_weights(q.data(), 256, 256, 4);
  REQUIRE(d2.size() == 16 * 512);
  CHECK(hex(crc_of(d2)) == "0x061fa373");
  const uint32_t first[4] = {0xd7f79880u, 0xe10c58f0u, 0xf61118b0u, 0x002b8820u};
  const uint32_t last[4] = {0xdf0b8a83u, 0xc2fe28d1u, 0xb5e6717fu, 0xa8891fc8u};
  for (int i = 0; i < 4; ++i) {
    CHECK(uint32_t(d2[size_t(i)]) == first[i]);
    CHECK(uint32_t(d2[size_t(15 * 512 + 508 + i)]) == last[i]);
  }
  CHECK(marlin::pack_weights_ref(q.data(), 256, 256, 4) == d2);

  // Chain: D1 -> unpack -> Marlin == D2; D2 -> unpack -> GPTQ == D1.
  auto from_d1 = gptq::unpack_qweight(d1.data(), 256, 256, 4);
  CHECK(marlin::pack_weights(from_d1.data(), 256, 256, 4) == d2);
  auto from_d2 = marlin::unpack_weights(d2.data(), 256, 256, 4);
  CHECK(gptq::pack_qweight(from_d2.data(), 256, 256, 4) == d1);

  const auto q8 = d_codes(256);
  auto d3 = marlin::pack_weights(q8.data(), 256, 256, 8);
  REQUIRE(d3.size() == 16 * 1024);
  CHECK(hex(crc_of(d3)) == "0x89b2ee39");
  const uint32_t first8[4] = {0x3f073800u, 0x5d275918u, 0x703c6f30u, 0x8e518548u};
  for (int i = 0; i < 4; ++i) CHECK(uint32_t(d3[size_t(i)]) == first8[i]);
  CHECK(marlin::pack_weights_ref(q8.data(), 256, 256, 8) == d3);
}

TEST_CASE("spec §8 S1/S2/S3: scale permutation CRCs", "[packer][spec]") {
  std::vector<uint16_t> s(2 * 256);
  for (int g = 0; g < 2; ++g)
    for (int n = 0; n < 256; ++n) s[size_t(g * 256 + n)] = float_to_half(float(256 * g + n));
  auto s1 = marlin::permute_scales(s.data(), 2, 256);
  CHECK(hex(crc_of(s1)) == "0xc733a995");
  const float f1[8] = {0, 8, 16, 24, 32, 40, 48, 56};
  for (int i = 0; i < 8; ++i) CHECK(half_to_float(s1[size_t(i)]) == f1[i]);

  auto s2 = marlin::permute_scales(s.data(), 1, 256);  // s[0][n] = n
  CHECK(hex(crc_of(s2)) == "0x9451f4ff");
  const float f2[8] = {0, 1, 8, 9, 16, 17, 24, 25};
  for (int i = 0; i < 8; ++i) CHECK(half_to_float(s2[size_t(i)]) == f2[i]);

  auto s3 = marlin::permute_scales_24(s.data(), 2, 256);
  CHECK(hex(crc_of(s3)) == "0xc5164e67");
  const float f3[8] = {0, 4, 1, 5, 2, 6, 3, 7};
  for (int i = 0; i < 8; ++i) CHECK(half_to_float(s3[size_t(i)]) == f3[i]);
}

TEST_CASE("spec §8 P1/P2: Sparse-Marlin values and metadata CRCs", "[packer][spec]") {
  static const int pairs[6][2] = {{0, 1}, {0, 2}, {0, 3}, {1, 2}, {1, 3}, {2, 3}};
  std::vector<uint8_t> q(256 * 256, 8), m(256 * 256, 0);
  for (int n = 0; n < 256; ++n)
    for (int g = 0; g < 64; ++g)
      for (int p : pairs[(5 * n + 3 * g) % 6]) {
        const int k = 4 * g + p;
        int v = (3 * n + 5 * k) % 15 - 7;
        if (v == 0) v = 1;
        q[size_t(k * 256 + n)] = uint8_t(v + 8);
        m[size_t(k * 256 + n)] = 1;
      }
  const uint8_t col0[8] = {1, 6, 8, 8, 8, 11, 1, 8};
  for (int k = 0; k < 8; ++k) REQUIRE(q[size_t(k * 256)] == col0[k]);
  for (int fast = 0; fast < 2; ++fast) {
    auto p = fast ? marlin::pack_24(q.data(), m.data(), 256, 256, 4) : marlin::pack_24_ref(q.data(), m.data(), 256, 256, 4);
    REQUIRE(p.B24.size() == 8 * 512);
    REQUIRE(p.meta.size() == 8 * 512);
    CHECK(hex(crc_of(p.B24)) == "0x12e3e7ec");
    const uint32_t b[4] = {0x3db63d61u, 0x1b94614eu, 0xe9c7942cu, 0xc7a5725fu};
    for (int i = 0; i < 4; ++i) CHECK(uint32_t(p.B24[size_t(i)]) == b[i]);
    CHECK(hex(crc_of(p.meta)) == "0x4f9bfbb4");
    const uint16_t mm[8] = {0x9494, 0xecec, 0x9494, 0xecec, 0xcece, 0xd8d8, 0xcece, 0xd8d8};
    for (int i = 0; i < 8; ++i) CHECK(uint16_t(p.meta[size_t(i)]) == mm[i]);
    // Compressed codes of column 0 are 1, 6, 11, 1: unpack shows them back at rows 0, 1, 5, 6.
    std::vector<uint8_t> cq(256 * 256), cm(256 * 256);
    marlin::unpack_24(p.B24.data(), p.meta.data(), 256, 256, 4, cq.data(), cm.data());
    CHECK(cq == q);
    CHECK(cm == m);
  }
}
