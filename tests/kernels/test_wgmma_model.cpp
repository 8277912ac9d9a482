// CPU model of the Hopper (wgmma) Marlin kernel's data movement (kernels/sm90/marlin_wgmma.cuh): one
// block at a time, the stages are filled exactly as the kernel's cp.async loops place bytes, each k16
// step expands the packed words the way dequant8 does, and the two 64-row wgmmas per warpgroup run on a
// model of wgmma's operands written here from the PTX ISA (A fragment layout, descriptor fields, the
// 128B swizzle, D fragment layout), independently of the kernel's index maps (kernels/sm90/
// wgmma_layout.h), which the replay uses only where the kernel does. The epilogue's lane pairing then
// writes C, and C must equal the float64 reference on the same packed bytes, every element written
// exactly once. What it cannot check is the hardware itself; the [gpu][wgmma] tests do that.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "checkpoint/half.h"
#include "kernels/reference_gemm.h"
#include "kernels/sm90/wgmma_layout.h"
#include "packer/marlin.h"
#include "tests/common.h"

using namespace marlinc;
using namespace marlinc::kernels;
namespace wl = marlinc::kernels::wgmma_layout;

namespace {

constexpr uint32_t kSeed = 20261123;
// The reference below rounds grouped weights (q - 8) * s to fp16 as the kernel's mul.f16x2 does; then
// every product is exact in double and only the summation order differs (relative error near 1e-16).
constexpr double kOrderTol = 1e-12;

// ---- the operand model (PTX ISA, wgmma .m64nNk16 with .f16 inputs) --------------------------------

// A from registers: warp w of the warpgroup holds rows 16w..16w+15; register r of lane l holds the two
// halves at row 16w + l/4 + 8 (r % 2), columns 2 (l % 4) + 8 (r / 2) + {0, 1} (low half first).
struct AElem { int row, col; };
AElem a_elem(int warp_in_wg, int lane, int r, int half) {
  return {16 * warp_in_wg + lane / 4 + 8 * (r % 2), 2 * (lane % 4) + 8 * (r / 2) + half};
}
// D (fp32): register 4i + 2h + e of lane l in warp w is row 16w + l/4 + 8h, column 8i + 2 (l % 4) + e.
AElem d_elem(int warp_in_wg, int lane, int reg) {
  const int i = reg / 4, h = (reg / 2) % 2, e = reg % 2;
  return {16 * warp_in_wg + lane / 4 + 8 * h, 8 * i + 2 * (lane % 4) + e};
}
// B from shared memory, K-major, 128B swizzle: element (k, n) of the 16 x N operand sits at the
// descriptor's start + (n / 8) * SBO + (n % 8) * 128 + 2 k, with bits 4-6 of the address XOR-ed by
// bits 7-9 (16-byte chunk index ^ row within the 1024-byte atom).
uint16_t b_elem(const std::vector<uint8_t>& smem, uint64_t desc, int k, int n) {
  const uint32_t start = uint32_t(desc & 0x3FFF) << 4;
  const uint32_t sbo = uint32_t((desc >> 32) & 0x3FFF) << 4;
  const uint32_t logical = start + uint32_t(n / 8) * sbo + uint32_t(n % 8) * 128 + uint32_t(2 * k);
  const uint32_t phys = logical ^ (((logical >> 7) & 7) << 4);
  if (phys + 2 > smem.size()) FAIL("B element (" << k << ", " << n << ") read past the stage");
  uint16_t v;
  std::memcpy(&v, smem.data() + phys, 2);
  return v;
}

// dequant8 on one packed word: pair p = (nibble p, nibble p + 4) - 8, as halves (fp16 or bf16 bits are
// irrelevant here: codes are small integers, exact in float).
void dequant_pairs(uint32_t q, float (&pairs)[4][2]) {
  for (int p = 0; p < 4; ++p) {
    pairs[p][0] = float(int((q >> (4 * p)) & 0xF) - 8);
    pairs[p][1] = float(int((q >> (4 * (p + 4))) & 0xF) - 8);
  }
}

uint32_t word_at(const std::vector<uint8_t>& smem, size_t byte) {
  uint32_t v;
  std::memcpy(&v, smem.data() + byte, 4);
  return v;
}

struct Problem {
  int64_t m, k, n, group;
  std::vector<uint16_t> A;  // [m, k] fp16
  std::vector<int32_t> B;   // [k/16, 2n]
  std::vector<uint16_t> s;  // [G, n] permuted fp16
};

Problem make_problem(std::mt19937& rng, int64_t m, int64_t k, int64_t n, int64_t group) {
  Problem p{m, k, n, group, {}, {}, {}};
  const int64_t G = group == -1 ? 1 : k / group;
  std::normal_distribution<float> nd(0.f, 1.f);
  std::uniform_int_distribution<int> code(0, 15);
  std::uniform_real_distribution<float> sd(0.002f, 0.02f);
  p.A.resize(size_t(m * k));
  for (auto& v : p.A) v = float_to_half(nd(rng));
  std::vector<uint8_t> q(size_t(k * n));
  for (auto& v : q) v = uint8_t(code(rng));
  std::vector<uint16_t> s_in(size_t(G * n));
  for (auto& v : s_in) v = float_to_half(sd(rng));
  p.B = marlin::pack_weights(q.data(), k, n, 4);
  p.s = marlin::permute_scales(s_in.data(), G, n);
  return p;
}

// Deliberate errors the replay can inject, to show that the check catches them.
enum class Mutation { None, MmaSyncAOrder, NoSwizzle, SwapSubblocks };

// The block's column width and its warps' maps: the kernel's 256-column tiles (two 64-row wgmmas per warpgroup),
// or the 128- and 192-column ones (one per warpgroup, two or three warpgroups; wgmma_layout.h, kFeat128, kFeat192).
struct Cols {
  int feat;
  int wgmmas() const { return feat == wl::kFeat ? 2 : 1; }
  int groups() const { return feat == wl::kFeat ? 2 : feat / 64; }  // consumer warpgroups
  int weight_row_bytes() const { return feat * 8; }
  int scale_row_bytes() const { return feat * 2; }
  // A stage's weight copy (the TMA box: each k16 row's feat / 2 int4 in order).
  int int4_row(int i) const {
    return feat == wl::kFeat ? wl::weight_int4_row(i) : feat == wl::kFeat128 ? wl::weight_int4_row128(i) : i / (feat / 2);
  }
  int int4_col(int i) const {
    return feat == wl::kFeat ? wl::weight_int4_col(i) : feat == wl::kFeat128 ? wl::weight_int4_col128(i) : i % (feat / 2);
  }
  int tile(int warp) const { return feat == wl::kFeat ? wl::warp_tile(warp) : wl::warp_tile128(warp); }
  int sub0(int warp, Mutation mu = Mutation::None) const {
    if (feat == wl::kFeat) return wl::warp_sub0(warp);
    return mu == Mutation::SwapSubblocks ? 3 - wl::warp_sub128(warp) : wl::warp_sub128(warp);
  }
  // The staged epilogue's buffer map.
  int epi_cols() const { return feat == wl::kFeat ? wl::kEpiCols : wl::kEpiCols128; }
  int epi_tokens() const { return feat == wl::kFeat ? wl::kEpiTokens : wl::kEpiTokens128; }
  int epi_reads() const { return feat == wl::kFeat ? wl::kEpiReads : wl::kEpiReads128; }
  int epi_byte(int lt, int col) const { return feat == wl::kFeat ? wl::epi_byte(lt, col) : wl::epi_byte128(lt, col); }
  int read_token(int s, int lane) const {
    return feat == wl::kFeat ? wl::epi_read_token(s, lane) : wl::epi_read_token128(s, lane);
  }
  int read_chunk(int s, int lane) const {
    return feat == wl::kFeat ? wl::epi_read_chunk(s, lane) : wl::epi_read_chunk128(s, lane);
  }
};
constexpr Cols kCols256{wl::kFeat}, kCols128{wl::kFeat128}, kCols192{wl::kFeat192};
static_assert(wl::kWeightRowBytes128 == 1024 && wl::kScaleRowBytes128 == 256, "two packed tiles a row");

// Replays the kernel for every (row chunk of NT rows, slice of cols.feat columns) with the whole k in one block
// (the cross-block reduction only adds partial tiles). Returns C in double; `writes` counts stores.
// `staged`: the producer-fed kernel's epilogue through the warps' buffers (its tiles: NT of 64 or more).
std::vector<double> replay(const Problem& p, int NT, std::vector<int>& writes, Mutation mu = Mutation::None,
                           bool staged = false, Cols cols = kCols256) {
  const int m = int(p.m), k = int(p.k), n = int(p.n);
  const bool grouped = p.group != -1 && p.group != p.k;
  const int shift = p.group == 32 ? 5 : p.group == 64 ? 6 : 7;
  const int a_bytes = NT * wl::kRowBytes, b_bytes = wl::kKB * cols.weight_row_bytes();
  const int stage_bytes = a_bytes + b_bytes + 2 * cols.scale_row_bytes();
  const int J = cols.wgmmas(), feat = cols.feat;
  std::vector<double> C(size_t(m) * n, 0.0);
  writes.assign(size_t(m) * n, 0);
  const int accs = NT / 2;  // fp32 registers per thread per 64-row wgmma

  for (int row0 = 0; row0 < m; row0 += NT)
    for (int slice = 0; slice < n / feat; ++slice) {
      // acc[thread][j][reg]
      std::vector<double> acc(size_t(128 * cols.groups()) * J * accs, 0.0);
      for (int kt = 0; kt < k / wl::kTK; ++kt) {
        std::vector<uint8_t> st(size_t(stage_bytes), 0xEE);  // unwritten bytes are garbage
        for (int i = 0; i < NT * 8; ++i) {  // load_a: chunk c of row r, zero past m
          const int r = i >> 3, c = i & 7;
          uint8_t* dst = st.data() + (mu == Mutation::NoSwizzle ? r * wl::kRowBytes + 16 * c : wl::act_chunk_byte(r, c));
          if (row0 + r < m) std::memcpy(dst, p.A.data() + size_t(row0 + r) * k + kt * wl::kTK + 8 * c, 16);
          else std::memset(dst, 0, 16);
        }
        for (int i = 0; i < b_bytes / 16; ++i) {  // load_weights
          const size_t src = (size_t(kt) * wl::kKB + cols.int4_row(i)) * (n / 2) + size_t(slice) * (feat / 2) +
                             cols.int4_col(i);
          std::memcpy(st.data() + a_bytes + 16 * i, p.B.data() + 4 * src, 16);
        }
        if (grouped) {
          const int g0 = (kt * wl::kTK) >> shift;
          const int rows = std::max(1, wl::kTK >> shift);
          for (int t = 0; t < rows * (feat / 8); ++t) {
            const int r = t / (feat / 8), c = t % (feat / 8);
            const size_t src = size_t(g0 + r) * (n / 8) + size_t(slice) * (feat / 8) + c;
            std::memcpy(st.data() + a_bytes + b_bytes + 16 * t, p.s.data() + 8 * src, 16);
          }
        }
        for (int kk = 0; kk < wl::kKB; ++kk)
          for (int wg = 0; wg < cols.groups(); ++wg)
            for (int j = 0; j < J; ++j) {
              // Gather the warpgroup's A operand from the lanes' registers (the model's A layout).
              std::vector<double> Am(64 * 16, std::nan(""));
              for (int wi = 0; wi < 4; ++wi) {
                const int warp = 4 * wg + wi, tile = cols.tile(warp), sub0 = cols.sub0(warp, mu);
                for (int lane = 0; lane < 32; ++lane) {
                  const uint32_t q = word_at(
                      st, size_t(a_bytes + kk * cols.weight_row_bytes() + wl::weight_byte(tile, lane, sub0) + 4 * j));
                  float pairs[4][2];
                  dequant_pairs(q, pairs);
                  if (grouped) {  // low half scales pairs 0, 1; high half pairs 2, 3 (scale2<false/true>)
                    const uint32_t sw = word_at(st, size_t(a_bytes + b_bytes + wl::scale_row(kk, shift) * cols.scale_row_bytes() +
                                                           wl::scale_byte(tile, lane, sub0) + 4 * j));
                    const float lo = half_to_float(uint16_t(sw & 0xFFFF)), hi = half_to_float(uint16_t(sw >> 16));
                    for (int pp = 0; pp < 4; ++pp)
                      for (int e = 0; e < 2; ++e)
                        pairs[pp][e] = half_to_float(float_to_half(pairs[pp][e] * (pp < 2 ? lo : hi)));
                  }
                  for (int r = 0; r < 4; ++r)
                    for (int hf = 0; hf < 2; ++hf) {
                      const AElem a = a_elem(wi, lane, r, hf);
                      Am[size_t(a.row) * 16 + a.col] = pairs[mu == Mutation::MmaSyncAOrder ? r : wl::a_from_pair(r)][hf];
                    }
                }
              }
              const uint64_t desc = wl::sw128_desc(wl::desc_start(0u, kk));  // stage at shared address 0
              REQUIRE((desc >> 62) == 1);        // 128B swizzle mode
              REQUIRE(((desc >> 49) & 7) == 0);  // base offset 0: the stage is atom-aligned
              std::vector<double> Bm(size_t(16) * NT);
              for (int kr = 0; kr < 16; ++kr)
                for (int nc = 0; nc < NT; ++nc) Bm[size_t(kr) * NT + nc] = half_to_float(b_elem(st, desc, kr, nc));
              // D += A B, scattered into the lanes' registers by the model's D layout.
              for (int wi = 0; wi < 4; ++wi)
                for (int lane = 0; lane < 32; ++lane)
                  for (int reg = 0; reg < accs; ++reg) {
                    const AElem d = d_elem(wi, lane, reg);
                    double sum = 0;
                    for (int kr = 0; kr < 16; ++kr) sum += Am[size_t(d.row) * 16 + kr] * Bm[size_t(kr) * NT + d.col];
                    acc[(size_t(32 * (4 * wg + wi) + lane) * J + j) * accs + reg] += sum;
                  }
            }
      }
      // Epilogue (per-channel scales, then the lane-pair exchange and 4-byte stores).
      auto value = [&](int warp, int lane, int j, int h, int i, int e) {
        const int c = slice * feat + wl::acc_col(cols.tile(warp), cols.sub0(warp), j, lane, h);
        const double sc = grouped ? 1.0 : half_to_float(p.s[size_t(wl::channel_scale_pos(c))]);
        return acc[(size_t(32 * warp + lane) * J + j) * accs + 4 * i + 2 * h + e] * sc;
      };
      // The pair lane `lane` stores for (j, h, i): token, column and the two values (from itself and from
      // lane ^ 4), as the kernel forms it before either store path.
      struct Pair { int tok, col; double v0, v1; };
      auto pair_of = [&](int warp, int lane, int j, int h, int i) {
        const int c = slice * feat + wl::acc_col(cols.tile(warp), cols.sub0(warp), j, lane, h);
        const int partner = lane ^ 4;
        const double other = value(warp, partner, j, h, i, wl::pair_send_e(partner));
        const bool even = wl::pair_even(lane);
        return Pair{row0 + wl::pair_token(i, lane), wl::pair_col(c, lane),
                    even ? value(warp, lane, j, h, i, 0) : other, even ? other : value(warp, lane, j, h, i, 1)};
      };
      auto store = [&](int tok, int col, double v) {
        if (tok >= m) return;
        C[size_t(tok) * n + col] = v;
        ++writes[size_t(tok) * n + col];
      };
      for (int warp = 0; warp < 4 * cols.groups(); ++warp) {
        if (staged) {
          // Producer-fed kernel: per round, every lane's pairs into the warp's buffer, then each lane's
          // 16-byte rows out; every buffer half written exactly once per round before it is read.
          const int wc0 = slice * feat + wl::acc_col(cols.tile(warp), cols.sub0(warp), 0, 0, 0);
          // Rounds as the kernel runs them (wg_write_c): on 128 columns each half of the tokens (one accumulator
          // array) in rounds of epi_tokens, the last one shorter where NT / 2 is not a multiple of it, its last
          // 16-byte read then on the first lanes only; on 256 columns whole rounds over all tokens.
          const int kI = cols.epi_tokens() / 8, chunks = cols.epi_cols() * 2 / 16;
          const int halves = feat == wl::kFeat ? 1 : 2, half_rows = NT / 8 / halves;
          if (feat == wl::kFeat && NT % cols.epi_tokens() != 0) FAIL("whole staging rounds on 256 columns");
          for (int half = 0; half < halves; ++half)
            for (int i0 = 0; i0 < half_rows; i0 += kI) {
              const int ni = std::min(kI, half_rows - i0), tokens = 8 * ni;
              std::vector<double> buf(wl::kEpiWarpBytes / 2, 0.0);
              std::vector<int> filled(wl::kEpiWarpBytes / 2, 0);
              for (int lane = 0; lane < 32; ++lane)
                for (int j = 0; j < J; ++j)
                  for (int h = 0; h < 2; ++h)
                    for (int ii = 0; ii < ni; ++ii) {
                      const Pair q = pair_of(warp, lane, j, h, half * half_rows + i0 + ii);
                      if (q.col - wc0 != wl::pair_col(wl::epi_col(j, lane, h), lane)) FAIL("epilogue column map");
                      const int byte = cols.epi_byte(wl::pair_token(ii, lane), q.col - wc0);
                      if (byte % 4 != 0 || byte < 0 || byte + 4 > wl::kEpiWarpBytes)
                        FAIL("staging pair at byte " << byte);
                      buf[size_t(byte / 2)] = q.v0, buf[size_t(byte / 2 + 1)] = q.v1;
                      ++filled[size_t(byte / 2)], ++filled[size_t(byte / 2 + 1)];
                    }
              // Every element of the round's tokens written once, nothing else.
              int once = 0, twice = 0;
              for (int f : filled) once += f == 1 ? 1 : 0, twice += f > 1 ? 1 : 0;
              REQUIRE(twice == 0);
              REQUIRE(once == tokens * cols.epi_cols());
              // The kernel's reads: whole instructions, then one on the first `lanes` lanes.
              const int reads = cols.epi_reads() * ni / kI, lanes = (cols.epi_reads() * ni % kI) * 32 / kI;
              REQUIRE(32 * reads + lanes == tokens * chunks);  // exactly the round's 16-byte rows
              for (int sr = 0; sr < reads + (lanes > 0 ? 1 : 0); ++sr)
                for (int lane = 0; lane < (sr < reads ? 32 : lanes); ++lane) {
                  const int lt = cols.read_token(sr, lane), x = cols.read_chunk(sr, lane);
                  const int byte = cols.epi_byte(lt, 8 * x);
                  if (byte % 16 != 0) FAIL("staging read at byte " << byte);
                  if (lt >= tokens) FAIL("staging read of token " << lt << " of " << tokens);
                  for (int e = 0; e < 8; ++e) {
                    if (filled[size_t(byte / 2 + e)] != 1) FAIL("staging read of an unwritten element");
                    store(row0 + half * (NT / 2) + i0 * 8 + lt, wc0 + 8 * x + e, buf[size_t(byte / 2 + e)]);
                  }
                }
            }
          continue;
        }
        for (int lane = 0; lane < 32; ++lane)
          for (int j = 0; j < J; ++j)
            for (int h = 0; h < 2; ++h)
              for (int i = 0; i < NT / 8; ++i) {
                const Pair q = pair_of(warp, lane, j, h, i);
                if (q.col % 2 != 0) FAIL("epilogue pair at odd column " << q.col);  // 4-byte stores
                store(q.tok, q.col, q.v0);
                store(q.tok, q.col + 1, q.v1);
              }
      }
    }
  return C;
}

// float64 GEMM on the packed bytes (dequantize_ref), with grouped weights rounded to fp16 the way the
// kernel scales them in half precision; per-channel scales multiply the exact sum.
std::vector<double> reference(const Problem& p) {
  RefGemmProblem rp{p.A.data(), p.B.data(), p.s.data(), p.m, p.n, p.k, p.group, ActType::F16};
  std::vector<float> W = dequantize_ref(rp);  // [k, n], exact
  if (p.group != -1 && p.group != p.k)
    for (auto& w : W) w = half_to_float(float_to_half(w));
  std::vector<double> C(size_t(p.m * p.n), 0.0);
  for (int64_t r = 0; r < p.m; ++r)
    for (int64_t kk = 0; kk < p.k; ++kk) {
      const double a = half_to_float(p.A[size_t(r * p.k + kk)]);
      for (int64_t c = 0; c < p.n; ++c) C[size_t(r * p.n + c)] += a * W[size_t(kk * p.n + c)];
    }
  return C;
}

// Sum of |C - ref| over sum of |ref|; the reference must not be all zero.
double mean_rel(const std::vector<double>& C, const std::vector<double>& ref) {
  double err = 0, mag = 0;
  for (size_t i = 0; i < C.size(); ++i) {
    err += std::fabs(C[i] - ref[i]);
    mag += std::fabs(ref[i]);
  }
  REQUIRE(mag > 0);
  return err / mag;
}

void check(const Problem& p, int NT, bool staged = false, Cols cols = kCols256) {
  std::vector<int> writes;
  const std::vector<double> C = replay(p, NT, writes, Mutation::None, staged, cols);
  const std::vector<double> ref = reference(p);
  size_t bad_writes = 0;
  for (int w : writes) bad_writes += w == 1 ? 0 : 1;
  INFO("m " << p.m << " k " << p.k << " n " << p.n << " group " << p.group << " NT " << NT << " staged " << staged
            << " columns " << cols.feat);
  REQUIRE(bad_writes == 0);
  REQUIRE(mean_rel(C, ref) <= kOrderTol);
}

// The replay without mutation matches the reference; with the warps' subblocks reversed inside their tile it must not.
void check_swapped_subblocks_fail(const Problem& p, int NT, bool staged, Cols cols) {
  const std::vector<double> ref = reference(p);
  for (Mutation mu : {Mutation::None, Mutation::SwapSubblocks}) {
    std::vector<int> writes;
    const std::vector<double> C = replay(p, NT, writes, mu, staged, cols);
    const double rel = mean_rel(C, ref);
    INFO("columns " << cols.feat << " mutation " << int(mu) << " rel err " << rel);
    if (mu == Mutation::None) REQUIRE(rel <= kOrderTol);
    else REQUIRE(rel > 0.1);
  }
}

}  // namespace

TEST_CASE("wgmma model: the Hopper kernel's index maps reproduce the reference GEMM", "[kernels][wgmma]") {
  std::mt19937 rng(kSeed);
  for (int64_t group : {int64_t(-1), int64_t(32), int64_t(64), int64_t(128)})
    for (int64_t m : {int64_t(1), int64_t(37), int64_t(130)}) {
      const Problem p = make_problem(rng, m, 256, 512, group);
      for (int NT : {8, 16, 32, 64, 128}) check(p, NT);
      for (int NT : {64, 128}) check(p, NT, true);
    }
}

TEST_CASE("wgmma model: 128-column tiles of up to 256 tokens reproduce the reference GEMM", "[kernels][wgmma]") {
  // wgmma_layout.h's kFeat128 maps: one m64nNTk16 per warpgroup and k16 step, NT up to 256 (two row chunks at
  // m = 300), four 128-column slices of n = 512, every group size.
  std::mt19937 rng(kSeed + 2);
  for (int64_t group : {int64_t(-1), int64_t(32), int64_t(64), int64_t(128)})
    for (int64_t m : {int64_t(1), int64_t(130), int64_t(300)}) {
      const Problem p = make_problem(rng, m, 256, 512, group);
      for (int NT : {64, 128, 256}) {
        check(p, NT, false, kCols128);
        check(p, NT, true, kCols128);
      }
      // The fit tiles (marlin_partition.h, wgmma_fit_tile): short last rounds of 8 (144), 16 (160), 24 (176) and
      // 56 (240) tokens per half; the producer-fed kernel is their only form. One and two row chunks, two group sizes.
      if (m > 1 && group < 64)
        for (int NT : {144, 160, 176, 240}) check(p, NT, true, kCols128);
    }
  // The warps' subblocks reversed inside their tile must fail: the check sees which column each word feeds.
  check_swapped_subblocks_fail(make_problem(rng, 16, 128, 256, 128), 256, false, kCols128);
}

TEST_CASE("wgmma model: 192-column tiles of three warpgroups reproduce the reference GEMM", "[kernels][wgmma]") {
  // wgmma_layout.h's kFeat192: warpgroup g expands packed tile g with the 128-column tiles' maps, 128 tokens (the only
  // token tile built with it), four 192-column slices of n = 768, every group size, one and two row chunks.
  std::mt19937 rng(kSeed + 3);
  for (int64_t group : {int64_t(-1), int64_t(32), int64_t(64), int64_t(128)})
    for (int64_t m : {int64_t(1), int64_t(130)}) check(make_problem(rng, m, 256, 768, group), 128, true, kCols192);
  // The warps' subblocks reversed inside their tile must fail.
  check_swapped_subblocks_fail(make_problem(rng, 16, 128, 384, 128), 128, true, kCols192);
}

TEST_CASE("wgmma model: the staged epilogue's buffer map is a bijection without bank conflicts", "[kernels][wgmma]") {
  for (const Cols& cols : {kCols256, kCols128}) {
    INFO("columns " << cols.feat);
    const int chunks = cols.epi_cols() * 2 / 16, J = cols.wgmmas();
    REQUIRE(cols.epi_tokens() * cols.epi_cols() * 2 == wl::kEpiWarpBytes);
    // Every (token, even column) pair slot once, every (token, chunk) read slot once, inside the buffer.
    std::vector<int> pair_hits(wl::kEpiWarpBytes / 4, 0), read_hits(wl::kEpiWarpBytes / 16, 0);
    for (int lt = 0; lt < cols.epi_tokens(); ++lt)
      for (int col = 0; col < cols.epi_cols(); col += 2) ++pair_hits[size_t(cols.epi_byte(lt, col) / 4)];
    for (int s = 0; s < cols.epi_reads(); ++s)
      for (int lane = 0; lane < 32; ++lane) {
        REQUIRE(cols.read_chunk(s, lane) < chunks);
        ++read_hits[size_t(cols.epi_byte(cols.read_token(s, lane), 8 * cols.read_chunk(s, lane)) / 16)];
      }
    for (int h : pair_hits) REQUIRE(h == 1);
    for (int h : read_hits) REQUIRE(h == 1);
    // Banks (4-byte words mod 32): a pair store (j, h, ii) puts 32 lanes on 32 banks; a 16-byte read is served
    // in four 8-lane phases, each of which must cover 32 distinct banks.
    for (int j = 0; j < J; ++j)
      for (int h = 0; h < 2; ++h)
        for (int ii = 0; ii < cols.epi_tokens() / 8; ++ii) {
          std::vector<int> bank(32, 0);
          for (int lane = 0; lane < 32; ++lane)
            ++bank[size_t(cols.epi_byte(wl::pair_token(ii, lane), wl::pair_col(wl::epi_col(j, lane, h), lane)) / 4 % 32)];
          for (int b : bank) REQUIRE(b == 1);
        }
    for (int s = 0; s < cols.epi_reads(); ++s)
      for (int phase = 0; phase < 4; ++phase) {
        std::vector<int> bank(32, 0);
        for (int lane = 8 * phase; lane < 8 * phase + 8; ++lane)
          for (int w = 0; w < 4; ++w)
            ++bank[size_t((cols.epi_byte(cols.read_token(s, lane), 8 * cols.read_chunk(s, lane)) / 4 + w) % 32)];
        for (int b : bank) REQUIRE(b == 1);
      }
  }
}

TEST_CASE("wgmma model: a wrong A-register order or swizzle is caught", "[kernels][wgmma]") {
  static_assert(wl::a_from_pair(1) == 2 && wl::a_from_pair(2) == 1, "A takes the column-c+8 pair second");
  static_assert(wl::act_chunk_byte(1, 0) == 128 + 16 && wl::act_chunk_byte(9, 3) == 9 * 128 + (3 ^ 1) * 16,
                "chunk c of row r lands at chunk c ^ (r % 8)");
  static_assert(wl::sw128_desc(1024u) == ((uint64_t(1) << 62) | (uint64_t(64) << 32) | (uint64_t(1) << 16) | 64u),
                "descriptor fields: start >> 4, LBO 1, SBO 1024 >> 4, 128B swizzle");
  // One descriptor per stage: step kk's equals step 0's plus desc_step's increment for every atom-aligned
  // stage of the shared window, with the CTA bits above it (masked by the descriptor) set or not.
  for (uint32_t cta : {0u, 5u << 24})
    for (uint32_t stage = 0; stage < (1u << 18); stage += wl::kSwizzleAtom)
      for (int kk = 0; kk < wl::kKB; ++kk)
        REQUIRE(wl::desc_step(wl::sw128_desc(wl::desc_start(cta | stage, 0)), kk) ==
                wl::sw128_desc(wl::desc_start(cta | stage, kk)));
  // The mma.sync B order {f0, f1, f2, f3} in place of {f0, f2, f1, f3} mixes columns c and c + 8 with
  // k 2t+8..; an unswizzled activation row hands wgmma the wrong k chunks. Both must fail the check.
  std::mt19937 rng(kSeed + 1);
  const Problem p = make_problem(rng, 16, 128, 256, 128);
  const std::vector<double> ref = reference(p);
  for (Mutation mu : {Mutation::None, Mutation::MmaSyncAOrder, Mutation::NoSwizzle}) {
    std::vector<int> writes;
    const std::vector<double> C = replay(p, 32, writes, mu);
    const double rel = mean_rel(C, ref);
    INFO("mutation " << int(mu) << " rel err " << rel);
    if (mu == Mutation::None) REQUIRE(rel <= kOrderTol);
    else REQUIRE(rel > 0.1);
  }
}
