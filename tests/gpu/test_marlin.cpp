// GPU tests of the Marlin W4A16 GEMM (kernels/marlin.h) against the float64 CPU reference built from
// the dequantized weights (kernels/reference_gemm.h). Fresh random data per case, output poisoned with
// NaN before each call, one workspace reused across all calls. Gate (issue 4, IST test.py):
// mean|C - ref| / mean|ref| <= 1e-3 for fp16, and no NaN anywhere in C.
#include <cuda_runtime.h>
#include <cublas_v2.h>

#include <algorithm>
#include <chrono>
#include <thread>
#include <tuple>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <initializer_list>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "checkpoint/half.h"
#include "checkpoint/safetensors.h"
#include "kernels/marlin.h"
#include "kernels/marlin_dispatch.h"
#include "kernels/marlin_partition.h"
#include "kernels/reference_gemm.h"
#include "packer/marlin.h"
#include "tests/common.h"

using namespace marlinc;
using namespace marlinc::kernels;

namespace {

constexpr double kTolF16 = 1e-3;  // IST Marlin test.py gate on mean relative error
// bf16 keeps 8 significant bits: the scaled weight (q-8)*s and the output each round at 2^-9
// relative, so the mean relative error sits near 1.5e-3 by construction (fp16 lands near 4e-4).
constexpr double kTolBF16 = 4e-3;
constexpr int kMaxRefRows = 8;    // rows checked against the reference for the large layer shapes
constexpr uint32_t kSeed = 4242;
// Natively every case here runs in milliseconds. Under compute-sanitizer a case normally takes well under
// a second, but one racecheck run on the H100 stalled a 512 x 512 launch for more than 20 s and then
// completed (the next case on the same stream passed); scripts/gpu.sh raises the limit there with
// MARLINC_TEST_HANG_S.
constexpr int kHangSeconds = 20;
constexpr int kMaxHangSeconds = 3600;
int hang_seconds() {
  const char* e = std::getenv("MARLINC_TEST_HANG_S");
  if (e == nullptr || *e == 0) return kHangSeconds;
  char* end = nullptr;
  const long v = std::strtol(e, &end, 10);
  return (*end == 0 && v > 0 && v <= kMaxHangSeconds) ? int(v) : kHangSeconds;
}

#define CUDA_OK(x)                                                                                   \
  do {                                                                                               \
    cudaError_t e_ = (x);                                                                            \
    if (e_ != cudaSuccess) FAIL(std::string(#x) + " failed at " + __FILE__ + ":" + std::to_string(__LINE__) + ": " + cudaGetErrorString(e_)); \
  } while (0)

template <class T>
struct DevBuf {
  T* p = nullptr;
  size_t n = 0;
  void resize(size_t count) {
    if (count <= n) return;
    if (p) cudaFree(p);
    p = nullptr;
    n = 0;
    REQUIRE(cudaMalloc(&p, count * sizeof(T)) == cudaSuccess);
    n = count;
  }
  ~DevBuf() { if (p) cudaFree(p); }
};

// One process-wide context: stream, cuBLAS handle and the workspace every call reuses.
struct Ctx {
  cudaStream_t stream = nullptr;
  cublasHandle_t cublas = nullptr;
  int sms = 0;
  DevBuf<uint8_t> ws;
  DevBuf<uint16_t> A, s, C;
  DevBuf<int32_t> B;
  Ctx() {
    REQUIRE(cudaSetDevice(0) == cudaSuccess);
    REQUIRE(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0) == cudaSuccess);
    REQUIRE(cudaStreamCreate(&stream) == cudaSuccess);
    REQUIRE(cublasCreate(&cublas) == CUBLAS_STATUS_SUCCESS);
    const size_t bytes = marlin_workspace_bytes(sms, true);
    ws.resize(bytes);
    REQUIRE(cudaMemset(ws.p, 0, bytes) == cudaSuccess);  // zeroed once, never again
  }
};
Ctx& ctx() {
  static Ctx c;
  return c;
}

struct Layer {
  int64_t k, n, group;
  ActType act;
  std::vector<uint8_t> q;      // [k, n]
  std::vector<uint16_t> s_in;  // [G, n] plain
  std::vector<int32_t> B;      // [k/16, 2n]
  std::vector<uint16_t> s;     // [G, n] permuted
};

uint16_t to_act(float v, ActType t) { return t == ActType::F16 ? float_to_half(v) : float_to_bf16(v); }
double from_act(uint16_t v, ActType t) { return t == ActType::F16 ? half_to_float(v) : bf16_to_float(v); }

Layer make_layer(std::mt19937_64& rng, int64_t k, int64_t n, int64_t group, ActType act) {
  Layer L{k, n, group, act, {}, {}, {}, {}};
  const int64_t G = group == -1 ? 1 : k / group;
  L.q.resize(size_t(k * n));
  for (size_t i = 0; i < L.q.size(); i += 16) {  // 16 codes from one 64-bit draw
    uint64_t r = rng();
    for (size_t j = 0; j < 16 && i + j < L.q.size(); ++j, r >>= 4) L.q[i + j] = uint8_t(r & 15);
  }
  std::uniform_real_distribution<float> sd(0.5f, 1.5f);
  const float base = 1.f / std::sqrt(float(k));  // keeps |C| near 1 for any depth
  L.s_in.resize(size_t(G * n));
  for (auto& v : L.s_in) v = to_act(base * sd(rng), act);
  L.B = marlin::pack_weights(L.q.data(), k, n, 4);
  L.s = marlin::permute_scales(L.s_in.data(), G, n);
  return L;
}

std::vector<uint16_t> random_A(std::mt19937_64& rng, int64_t m, int64_t k, ActType act) {
  std::vector<uint16_t> A(size_t(m * k));
  std::normal_distribution<float> nd(0.f, 1.f);
  for (auto& v : A) v = to_act(nd(rng), act);
  return A;
}

// Reference rows straight from the codes and plain scales (float64), OpenMP over column blocks.
std::vector<double> ref_rows_direct(const Layer& L, const std::vector<uint16_t>& A, const std::vector<int64_t>& rows) {
  const int64_t g = L.group == -1 ? L.k : L.group, R = int64_t(rows.size()), kBlock = 256;
  std::vector<double> a(size_t(L.k * R));  // [k, R]
  for (int64_t r = 0; r < R; ++r)
    for (int64_t kk = 0; kk < L.k; ++kk) a[size_t(kk * R + r)] = from_act(A[size_t(rows[size_t(r)] * L.k + kk)], L.act);
  std::vector<double> out(size_t(R * L.n));
  const int64_t blocks = (L.n + kBlock - 1) / kBlock;
#pragma omp parallel for schedule(dynamic, 1)
  for (int64_t b = 0; b < blocks; ++b) {
    const int64_t c0 = b * kBlock, w = std::min(kBlock, L.n - c0);
    std::vector<double> acc(static_cast<size_t>(R * w), 0.0), wr(static_cast<size_t>(w));
    for (int64_t kk = 0; kk < L.k; ++kk) {
      for (int64_t c = 0; c < w; ++c)
        wr[size_t(c)] = double(int(L.q[size_t(kk * L.n + c0 + c)]) - 8) * from_act(L.s_in[size_t((kk / g) * L.n + c0 + c)], L.act);
      for (int64_t r = 0; r < R; ++r) {
        const double av = a[size_t(kk * R + r)];
        for (int64_t c = 0; c < w; ++c) acc[size_t(r * w + c)] += av * wr[size_t(c)];
      }
    }
    for (int64_t r = 0; r < R; ++r)
      for (int64_t c = 0; c < w; ++c) out[size_t(r * L.n + c0 + c)] = acc[size_t(r * w + c)];
  }
  return out;
}

// mean|C - ref| / mean|ref| over the given rows of C [m, n]; ref from the packed bytes or the codes.
double mean_rel_err(const Layer& L, const std::vector<uint16_t>& A, const std::vector<uint16_t>& C,
                    const std::vector<int64_t>& rows, bool packed_reference) {
  const int64_t m = int64_t(A.size()) / L.k;
  std::vector<double> ref;
  if (packed_reference) {
    RefGemmProblem p{A.data(), L.B.data(), L.s.data(), m, L.n, L.k, L.group, L.act};
    ref = reference_gemm(p, rows);
  } else {
    ref = ref_rows_direct(L, A, rows);
  }
  double err = 0, mag = 0;
  for (size_t ri = 0; ri < rows.size(); ++ri)
    for (int64_t col = 0; col < L.n; ++col) {
      const double r = ref[ri * size_t(L.n) + size_t(col)];
      err += std::fabs(from_act(C[size_t(rows[ri] * L.n + col)], L.act) - r);
      mag += std::fabs(r);
    }
  REQUIRE(mag > 0);
  return err / mag;
}

struct RunOpts {
  MarlinPath path = MarlinPath::Marlin;
  int thread_k = 0, thread_n = 0;
  int thread_m_blocks = 0;
  int mma_parts = 0;
  int wgmma_rows = 0;
  int wgmma_pipeline = 0;
  int num_sms = 0;
  bool packed_reference = true;  // reference_gemm on the packed bytes (else the direct sum from codes)
  int max_ref_rows = 1 << 30;
  bool wgmma_split = true;
};

// Uploads the layer and A (once per call: cheap next to the CPU reference), runs m x k x n and returns C, checked
// for NaN (unwritten outputs).
std::vector<uint16_t> gemm_out(const Layer& L, const std::vector<uint16_t>& A, const RunOpts& o) {
  Ctx& c = ctx();
  const int64_t m = int64_t(A.size()) / L.k;
  c.A.resize(A.size());
  c.B.resize(L.B.size());
  c.s.resize(L.s.size());
  c.C.resize(size_t(m * L.n));
  CUDA_OK(cudaMemcpy(c.A.p, A.data(), A.size() * 2, cudaMemcpyHostToDevice));
  CUDA_OK(cudaMemcpy(c.B.p, L.B.data(), L.B.size() * 4, cudaMemcpyHostToDevice));
  CUDA_OK(cudaMemcpy(c.s.p, L.s.data(), L.s.size() * 2, cudaMemcpyHostToDevice));
  CUDA_OK(cudaMemset(c.C.p, 0xff, size_t(m * L.n) * 2));  // 0xffff is NaN in fp16 and bf16

  MarlinGemm g;
  g.A = c.A.p; g.B = c.B.p; g.s = c.s.p; g.C = c.C.p;
  g.m = int(m); g.n = int(L.n); g.k = int(L.k);
  g.group_size = int(L.group);
  g.act = L.act;
  g.workspace = c.ws.p;
  g.workspace_bytes = c.ws.n;
  g.stream = c.stream;
  g.cublas = c.cublas;
  g.num_sms = o.num_sms;
  g.path = o.path;
  g.thread_k = o.thread_k;
  g.thread_n = o.thread_n;
  g.thread_m_blocks = o.thread_m_blocks;
  g.mma_parts = o.mma_parts;
  g.wgmma_rows = o.wgmma_rows;
  g.wgmma_pipeline = o.wgmma_pipeline;
  g.wgmma_split = o.wgmma_split;
  INFO("wgmma_split " << o.wgmma_split);
  INFO("wgmma_rows " << o.wgmma_rows << " wgmma_pipeline " << o.wgmma_pipeline);
  INFO("mma_parts " << o.mma_parts);
  INFO("m_blocks " << o.thread_m_blocks << " m " << m << " k " << L.k << " n " << L.n << " g " << L.group << " act " << int(L.act) << " tiles ("
            << o.thread_k << "," << o.thread_n << ") sms " << o.num_sms << " path " << int(o.path));
  const MarlinStatus st = marlin_gemm(g);
  INFO("status: " << marlin_status_name(st));
  REQUIRE(st == MarlinStatus::Ok);
  // A stripe lock that never opens hangs the kernel: name the case instead of waiting forever.
  const auto t0 = std::chrono::steady_clock::now();
  const int hang_s = hang_seconds();
  cudaError_t q;
  while ((q = cudaStreamQuery(c.stream)) == cudaErrorNotReady) {
    if (std::chrono::steady_clock::now() - t0 > std::chrono::seconds(hang_s))
      FAIL("the kernel did not finish within " << hang_s << " s (deadlocked stripe reduction? MARLINC_TEST_HANG_S "
                                               "raises the limit)");
    std::this_thread::sleep_for(std::chrono::microseconds(200));
  }
  CUDA_OK(q);
  CUDA_OK(cudaGetLastError());
  std::vector<uint16_t> C(size_t(m * L.n));
  CUDA_OK(cudaMemcpy(C.data(), c.C.p, C.size() * 2, cudaMemcpyDeviceToHost));

  size_t nans = 0;
  for (uint16_t v : C) nans += std::isnan(from_act(v, L.act)) ? 1 : 0;
  INFO("NaN outputs (unwritten or broken): " << nans << " of " << C.size());
  REQUIRE(nans == 0);
  return C;
}

// Checks C against the reference: every row, or o.max_ref_rows of them (first, last and random ones).
double check_rows(const Layer& L, const std::vector<uint16_t>& A, const std::vector<uint16_t>& C,
                  std::mt19937_64& rng, const RunOpts& o) {
  const int64_t m = int64_t(A.size()) / L.k;
  INFO("checked: m " << m << " k " << L.k << " n " << L.n << " g " << L.group << " act " << int(L.act) << " path "
                     << int(o.path) << " wgmma_rows " << o.wgmma_rows << " thread_n " << o.thread_n << " sms "
                     << o.num_sms << " wgmma_split " << o.wgmma_split);
  std::vector<int64_t> rows;
  const int64_t want = std::min<int64_t>(m, o.max_ref_rows);
  if (want == m) {
    for (int64_t r = 0; r < m; ++r) rows.push_back(r);
  } else {  // first, last and random rows in between
    rows = {0, m - 1};
    std::uniform_int_distribution<int64_t> rd(1, m - 2);
    while (int64_t(rows.size()) < want) rows.push_back(rd(rng));
  }
  const double rel = mean_rel_err(L, A, C, rows, o.packed_reference);
  INFO("mean rel err " << rel);
  REQUIRE(rel <= (L.act == ActType::F16 ? kTolF16 : kTolBF16));
  return rel;
}

// Runs m x k x n on fresh random activations and checks the output.
double run_case(const Layer& L, int64_t m, std::mt19937_64& rng, const RunOpts& o) {
  const std::vector<uint16_t> A = random_A(rng, m, L.k, L.act);
  return check_rows(L, A, gemm_out(L, A, o), rng, o);
}

// The Hopper kernel's producer-warpgroup form on rows-row tiles (0: the launcher's pick) and `sms` SMs (0: all of
// them); tn: the tile's columns (0: the token tile's own width; 128 with 128 rows: 128 x 128 tiles).
RunOpts producer(int rows, int sms, int ref_rows = 1 << 30, int tn = 0) {
  RunOpts o;
  o.path = MarlinPath::Wgmma;
  o.wgmma_rows = rows;
  o.thread_n = tn;
  o.wgmma_pipeline = 2;
  o.num_sms = sms;
  o.max_ref_rows = ref_rows;
  return o;
}

// MarlinPath::Auto on `sms` SMs (0: all of them), ref_rows rows checked against the reference.
RunOpts auto_pick(int sms, int ref_rows) {
  RunOpts o;
  o.path = MarlinPath::Auto;
  o.num_sms = sms;
  o.max_ref_rows = ref_rows;
  return o;
}

const int64_t kMs[] = {1, 2, 7, 16, 17, 33, 64, 100, 128, 256, 1000};
// MarlinGemm::mma_parts at least the k tiles: the mma.sync kernel's plain stripes (kernels/marlin_partition.h,
// mma_parts_blocks leaves the grid as it is).
constexpr int kPlainStripes = 1 << 16;
const int64_t kGroups[] = {-1, 32, 64, 128};

// Whether the producer kernel's launch on `sms` SMs has stripes of one and a half slices or more that cut
// slices (kernels/marlin_partition.h, slice_early_deposit): every shared slice's finisher then fetches the
// other block's deposit through its ring. 512 x 2048 with 128-row tiles: 8 slices of 8 tiles in stripes of 13.
bool takes_early_deposits(int64_t m, int64_t n, int64_t k, int sms) {
  const int rows = kernels::kEarlyDepositRows, k_tiles = int(k / kernels::kWgmmaTileK);
  const int whole = kernels::wgmma_whole_slices(int(m), int(n), rows, sms);
  const kernels::Partition P =
      kernels::marlin_partition(int(m), int(n / kernels::kWgmmaTileN), k_tiles, rows, sms, whole);
  return whole == 0 && !kernels::wgmma_pair_tiles(int(m), int(n), int(k), rows, sms) && P.iters % k_tiles != 0 &&
         kernels::slice_early_deposit(P.iters, k_tiles, rows);
}
// The Hopper kernel's k-split on `sms` SMs with rows x tn tiles (tn 0: the token tile's own width) as kernels/marlin.cu
// takes it (kernels/marlin_partition.h, wgmma_split_parts): its parts per slice, else 0; `same_cuts`: the stripes it
// replaces cut every slice into the same parts (so the in-order finisher's output is the same bit for bit).
int split_parts_of(int64_t m, int64_t n, int64_t k, int rows, int sms, int tn = 0, bool* same_cuts = nullptr) {
  const int tile_n = tn > 0 ? tn : kernels::wgmma_tile_n(rows);
  const int k_tiles = int(k / kernels::kWgmmaTileK), n_tiles = int(n / tile_n);
  if (!kernels::wgmma_split_tile(rows, tile_n)) return 0;
  const int whole = kernels::wgmma_whole_slices(int(m), int(n), rows, sms, tile_n);
  if (whole > 0 || (tile_n == kernels::wgmma_tile_n(rows) && kernels::wgmma_pair_tiles(int(m), int(n), int(k), rows, sms)))
    return 0;
  const kernels::Partition P = kernels::marlin_partition(int(m), n_tiles, k_tiles, rows, sms);
  const int split = kernels::wgmma_split_parts(P.par, n_tiles, k_tiles, sms, P.iters);
  if (same_cuts) *same_cuts = split > 0 && P.iters * split == k_tiles;
  return split;
}
const std::pair<int, int64_t> kEarlyCases[] = {{5, 65}, {5, 100}, {10, 200}};  // (SMs, m): one and two row chunks
struct PairCase { int64_t m; int sms; };
const PairCase kWidePairCases[] = {{100, 12}, {256, 13}, {300, 24}, {1000, 48}};  // on 1024 x 768
// The fit tiles' pairs on 1024 x 768 (6 slices of 128): rows, m, SMs; one and two row chunks, the last one short.
struct FitPairCase { int rows; int64_t m; int sms; };
const FitPairCase kFitPairCases[] = {{144, 100, 12}, {160, 300, 24}, {208, 200, 13}, {240, 450, 26}};

}  // namespace

TEST_CASE("marlin: small shapes, every m and group size (fp16)", "[gpu][marlin]") {
  std::mt19937_64 rng(kSeed);
  const int64_t shapes[][2] = {{128, 256}, {256, 512}, {512, 768}, {1024, 1024}, {4096, 320}};
  for (auto& sh : shapes)
    for (int64_t g : kGroups) {
      if (g != -1 && sh[0] % g != 0) continue;
      const Layer L = make_layer(rng, sh[0], sh[1], g, ActType::F16);
      for (int64_t m : kMs) {
        RunOpts o;
        o.max_ref_rows = 64;
        run_case(L, m, rng, o);
      }
    }
}

TEST_CASE("marlin: every tile configuration and m-block count, fp16 and bf16", "[gpu][marlin]") {
  std::mt19937_64 rng(kSeed + 1);
  const int tiles[][2] = {{128, 128}, {64, 256}, {128, 64}};
  for (ActType act : {ActType::F16, ActType::BF16})
    for (int64_t g : {int64_t(-1), int64_t(128), int64_t(32)}) {
      const Layer L = make_layer(rng, 1024, 768, g, act);
      for (auto& t : tiles)
        for (int64_t m : {int64_t(1), int64_t(17), int64_t(33), int64_t(64), int64_t(100)}) {
          if (768 % t[1] != 0) continue;
          RunOpts o;
          o.thread_k = t[0];
          o.thread_n = t[1];
          run_case(L, m, rng, o);
        }
    }
}

// Forced m tiles shorter than m: several row chunks, each split over its own group of blocks (or, on
// few SMs, whole chunks walked by one block); every chunk's rows and its partial tiles must land.
TEST_CASE("marlin: row chunks side by side (forced m tile)", "[gpu][marlin][sanitize]") {
  std::mt19937_64 rng(kSeed + 8);
  for (int64_t g : {int64_t(-1), int64_t(128)}) {
    const Layer L = make_layer(rng, 1024, 768, g, ActType::F16);
    for (int mb : {1, 2, 3})
      for (int sms : {0, 2})
        for (int64_t m : {int64_t(33), int64_t(64), int64_t(100)}) {
          RunOpts o;
          o.thread_m_blocks = mb;
          o.num_sms = sms;
          run_case(L, m, rng, o);
        }
  }
}

// mma_parts above the k tiles keeps the plain stripes, which Auto replaces by whole slices on this 1024-deep layer at
// m <= 64 (kernels/marlin_dispatch.h, mma_auto_parts).
TEST_CASE("marlin: stripes crossing slices on few SMs (lock + fp32 partial reduction)", "[gpu][marlin][sanitize]") {
  std::mt19937_64 rng(kSeed + 2);
  for (int64_t g : {int64_t(-1), int64_t(64)}) {
    const Layer L = make_layer(rng, 1024, 512, g, ActType::F16);
    for (int sms : {1, 3, 5, 7})
      for (int64_t m : {int64_t(1), int64_t(33), int64_t(100)}) {
        RunOpts o;
        o.num_sms = sms;
        o.mma_parts = kPlainStripes;
        run_case(L, m, rng, o);
      }
  }
  const Layer Lb = make_layer(rng, 512, 256, 128, ActType::BF16);
  RunOpts o;
  o.num_sms = 3;
  run_case(Lb, 17, rng, o);
}

// Whole-k stripes (kernels/marlin_dispatch.h): on two SMs a 512-wide layer's four 128-wide slices fill
// the 2 x 2 block slots, so each block owns one slice for the whole depth and no slice is reduced
// across blocks; Auto and the forced mma.sync path both take it at m <= 16.
TEST_CASE("marlin: whole-k stripes, one block per column slice", "[gpu][marlin][sanitize]") {
  std::mt19937_64 rng(kSeed + 11);
  REQUIRE(whole_k_stripes(1, 512, 1024, 2 * 2));
  REQUIRE(whole_k_stripes(16, 768, 2048, 3 * 2));
  for (int64_t g : {int64_t(-1), int64_t(128)}) {
    const Layer L = make_layer(rng, 1024, 512, g, ActType::F16);
    for (int64_t m : {int64_t(1), int64_t(7), int64_t(16)})
      for (MarlinPath path : {MarlinPath::Auto, MarlinPath::Marlin}) {
        RunOpts o;
        o.num_sms = 2;
        o.path = path;
        run_case(L, m, rng, o);
      }
  }
  const Layer Lb = make_layer(rng, 2048, 768, 64, ActType::BF16);  // six slices on three SMs
  RunOpts o;
  o.num_sms = 3;
  o.path = MarlinPath::Auto;
  run_case(Lb, 16, rng, o);
}

// Fewer blocks on a slice (MarlinGemm::mma_parts, kernels/marlin_partition.h, mma_parts_blocks): whole slices (1), and
// stripes of ceil(k tiles / parts) that cross slices where the parts do not divide the depth (896 deep: seven 128-deep
// tiles), on one and several row chunks (m = 100 on 32-row tiles: four), Auto and the forced mma.sync path.
TEST_CASE("marlin: mma.sync stripes with a forced count of blocks per slice", "[gpu][marlin][sanitize]") {
  std::mt19937_64 rng(kSeed + 23);
  REQUIRE(kernels::mma_parts_blocks(1, 14, 7, 16, 264, 1) == 14);
  REQUIRE(kernels::mma_parts_blocks(100, 14, 7, 32, 264, 2) == 4 * 25);  // stripes of 4 tiles: 25 per chunk
  REQUIRE(kernels::mma_parts_blocks(100, 14, 7, 32, 64, 2) == 64);
  for (int64_t g : {int64_t(-1), int64_t(128)}) {
    const Layer L = make_layer(rng, 896, 896, g, ActType::F16);
    for (int parts : {1, 2, 3, 7})
      for (int64_t m : {int64_t(1), int64_t(16), int64_t(33), int64_t(100)}) {
        RunOpts o;
        o.mma_parts = parts;
        o.thread_m_blocks = m == 100 ? 2 : 0;
        o.path = parts == 2 ? MarlinPath::Auto : MarlinPath::Marlin;
        run_case(L, m, rng, o);
      }
  }
  const Layer Lb = make_layer(rng, 1152, 384, 64, ActType::BF16);
  RunOpts o;
  o.mma_parts = 2;
  o.thread_k = 128;
  o.thread_n = 128;
  run_case(Lb, 40, rng, o);
}

// marlin_timeline: a MARLINC_TIMELINE=ON build (scripts/experiments/timeline.sh) writes one ordered record
// per block of each launch; any other build leaves the buffer untouched.
TEST_CASE("marlin: per-block timeline records", "[gpu][marlin][timeline]") {
  std::mt19937_64 rng(kSeed + 4);
  constexpr int kSlots = 2;
  DevBuf<unsigned long long> buf;
  buf.resize(size_t(kSlots) * kTlSlotWords);
  CUDA_OK(cudaMemset(buf.p, 0, buf.n * 8));
  const bool on = marlin_timeline(buf.p, kSlots);
  const Layer L = make_layer(rng, 1024, 512, 128, ActType::F16);
  RunOpts o;
  run_case(L, 1, rng, o);  // launch 0: mma.sync kernel
  const bool wg = marlin_wgmma_available();
  if (wg) {
    o.path = MarlinPath::Wgmma;
    run_case(L, 16, rng, o);  // launch 1: Hopper kernel
  }
  marlin_timeline(nullptr, 0);
  std::vector<unsigned long long> h(buf.n);
  CUDA_OK(cudaMemcpy(h.data(), buf.p, h.size() * 8, cudaMemcpyDeviceToHost));
  const size_t written = size_t(std::count_if(h.begin(), h.end(), [](unsigned long long v) { return v != 0; }));
  INFO("timeline build: " << on);
  if (!on) {
    REQUIRE(written == 0);
    return;
  }
  for (int slot = 0; slot < (wg ? 2 : 1); ++slot) {
    int blocks = 0, disordered = 0, bad_sm = 0;
    for (int b = 0; b < kTlMaxBlocks; ++b) {
      const unsigned long long* r = h.data() + size_t(slot) * kTlSlotWords + size_t(b) * kTlRecord;
      if (r[kTlEntry] == 0) continue;
      ++blocks;
      if (!(r[kTlEntry] <= r[kTlWaited] && r[kTlWaited] <= r[kTlFirstData] && r[kTlFirstData] <= r[kTlComputed] &&
            r[kTlComputed] <= r[kTlExit]))
        ++disordered;
      if (r[kTlSm] >= unsigned(ctx().sms)) ++bad_sm;
    }
    INFO("slot " << slot);
    REQUIRE(blocks >= 1);
    REQUIRE(disordered == 0);
    REQUIRE(bad_sm == 0);
  }
}

// overlap_previous lets a call stream its weights while the previous kernel runs; its activations must
// still be read only after that kernel has finished. A chain where each call's A is the previous
// call's output (poisoned with NaN before the chain starts) catches an early read of A or of the
// shared workspace: the outputs would hold NaN or stale values.
TEST_CASE("marlin: overlap_previous on a chain of dependent calls", "[gpu][marlin][sanitize]") {
  std::mt19937_64 rng(kSeed + 7);
  Ctx& c = ctx();
  const int64_t dims[] = {1024, 768, 1024, 512};  // k of call i = n of call i - 1
  std::vector<Layer> Ls;
  for (int i = 0; i < 3; ++i) Ls.push_back(make_layer(rng, dims[i], dims[i + 1], i == 1 ? -1 : 128, ActType::F16));
  std::vector<DevBuf<int32_t>> B(3);
  std::vector<DevBuf<uint16_t>> S(3), X(4);  // X[0] = input, X[i + 1] = output of call i
  for (int i = 0; i < 3; ++i) {
    B[size_t(i)].resize(Ls[size_t(i)].B.size());
    S[size_t(i)].resize(Ls[size_t(i)].s.size());
    CUDA_OK(cudaMemcpy(B[size_t(i)].p, Ls[size_t(i)].B.data(), Ls[size_t(i)].B.size() * 4, cudaMemcpyHostToDevice));
    CUDA_OK(cudaMemcpy(S[size_t(i)].p, Ls[size_t(i)].s.data(), Ls[size_t(i)].s.size() * 2, cudaMemcpyHostToDevice));
  }
  // Auto's plan (whole slices on these shallow layers at m <= 64: no deposits) and the plain stripes (deposits and
  // locks in the workspace that the next call shares).
  for (int parts : {0, kPlainStripes})
    for (int sms : {0, 5})
      for (int64_t m : {int64_t(1), int64_t(33), int64_t(100)}) {
        for (int i = 0; i < 4; ++i) X[size_t(i)].resize(size_t(m * dims[i]));
        const std::vector<uint16_t> A0 = random_A(rng, m, dims[0], ActType::F16);
        CUDA_OK(cudaMemcpy(X[0].p, A0.data(), A0.size() * 2, cudaMemcpyHostToDevice));
        for (int i = 1; i < 4; ++i) CUDA_OK(cudaMemsetAsync(X[size_t(i)].p, 0xff, size_t(m * dims[i]) * 2, c.stream));
        for (int i = 0; i < 3; ++i) {
          MarlinGemm g;
          g.A = X[size_t(i)].p; g.B = B[size_t(i)].p; g.s = S[size_t(i)].p; g.C = X[size_t(i) + 1].p;
          g.m = int(m); g.n = int(dims[i + 1]); g.k = int(dims[i]);
          g.group_size = int(Ls[size_t(i)].group);
          g.workspace = c.ws.p;
          g.workspace_bytes = c.ws.n;
          g.stream = c.stream;
          g.num_sms = sms;
          g.path = MarlinPath::Marlin;
          g.mma_parts = parts;
          g.overlap_previous = i > 0;
          REQUIRE(marlin_gemm(g) == MarlinStatus::Ok);
        }
        CUDA_OK(cudaStreamSynchronize(c.stream));
        std::vector<std::vector<uint16_t>> H(4);
        for (int i = 0; i < 4; ++i) {
          H[size_t(i)].resize(size_t(m * dims[i]));
          CUDA_OK(cudaMemcpy(H[size_t(i)].data(), X[size_t(i)].p, H[size_t(i)].size() * 2, cudaMemcpyDeviceToHost));
        }
        std::vector<int64_t> rows;
        for (int64_t r = 0; r < m; ++r) rows.push_back(r);
        for (int i = 0; i < 3; ++i) {
          size_t nans = 0;
          for (uint16_t v : H[size_t(i) + 1]) nans += std::isnan(half_to_float(v)) ? 1 : 0;
          INFO("mma_parts " << parts << " sms " << sms << " m " << m << " call " << i << ": NaN outputs " << nans);
          REQUIRE(nans == 0);
          // Each call against the reference on the input it actually had (the previous call's output).
          REQUIRE(mean_rel_err(Ls[size_t(i)], H[size_t(i)], H[size_t(i) + 1], rows, true) <= kTolF16);
        }
      }
}

// The Hopper kernel (warpgroup MMA, sm_90a): every token tile, group size and m, stripes that cross
// slices (few SMs: fp32 partial tiles and the in-order finisher) and bf16. Skipped on other GPUs.
TEST_CASE("marlin: Hopper wgmma kernel", "[gpu][marlin][wgmma]") {
  if (!marlin_wgmma_available()) {
    WARN("skipped: no compute capability 9.0 device, or no sm_90a code in this build");
    return;
  }
  std::mt19937_64 rng(kSeed + 9);
  for (ActType act : {ActType::F16, ActType::BF16})
    for (int64_t g : kGroups) {
      const Layer L = make_layer(rng, 1024, 768, g, act);
      // -32: 32-row tiles on the block-barrier pipeline (the producer form is their own pick).
      for (int rows : {0, 8, 16, 32, -32, 64, 128})
        for (int sms : {0, 3})
          for (int64_t m : kMs) {
            if (act == ActType::BF16 && rows != 0 && m != 100) continue;
            RunOpts o;
            o.path = MarlinPath::Wgmma;
            o.wgmma_rows = rows < 0 ? -rows : rows;
            o.wgmma_pipeline = rows < 0 ? 1 : 0;
            o.num_sms = sms;
            o.max_ref_rows = 48;
            run_case(L, m, rng, o);
          }
      // A narrow layer at m > 64 (wgmma_prefer_128x128) with the block-barrier pipeline forced: that pipeline has
      // no 128-column tiles, so the launcher keeps 128 x 256 instead of refusing.
      RunOpts o;
      o.path = MarlinPath::Wgmma;
      o.wgmma_pipeline = 1;
      o.max_ref_rows = 48;
      run_case(L, 100, rng, o);
    }
}

// The warp-specialized pipeline (a producer warpgroup and mbarriers) on the same cases as above where
// it is built (32-, 48-, 64- and 128-row tiles, and the wide tile of 256 rows x 128 columns); its refusal of smaller
// tiles is in the argument-check case.
TEST_CASE("marlin: Hopper wgmma kernel, producer warpgroup", "[gpu][marlin][wgmma]") {
  if (!marlin_wgmma_available()) {
    WARN("skipped: no compute capability 9.0 device, or no sm_90a code in this build");
    return;
  }
  std::mt19937_64 rng(kSeed + 13);
  for (ActType act : {ActType::F16, ActType::BF16})
    for (int64_t g : kGroups) {
      const Layer L = make_layer(rng, 1024, 768, g, act);
      // -128: 128 x 128 tiles; fit tiles with a short last epilogue round of 8 rows (144), 32 (192) and 56 (240).
      for (int rows : {32, 48, 64, 128, kernels::kWgmmaWideRows, -128, 144, 192, 240})
        for (int sms : {0, 3})
          for (int64_t m : kMs) {
            if (act == ActType::BF16 && m != 100 && m != 1000) continue;
            run_case(L, m, rng, rows < 0 ? producer(-rows, sms, 48, kernels::kWgmmaWideTileN) : producer(rows, sms, 48));
          }
    }
  // A long stripe over many slices and row chunks: the ring's phases wrap many times per block, on every
  // tile. On 5 SMs at m = 300 every block owns all four slices whole (wgmma_whole_slices), as 3 SMs at
  // m = 100 give 64-row blocks all three slices above.
  const Layer big = make_layer(rng, 4096, 1024, 128, ActType::F16);
  for (int rows : {64, 128, kernels::kWgmmaWideRows})
    for (int sms : {1, 5}) run_case(big, 300, rng, producer(rows, sms, 16));
  for (int sms : {1, 5}) run_case(big, 300, rng, producer(128, sms, 16, kernels::kWgmmaWideTileN));
  // 128 x 192 tiles (three consumer warpgroups) on 8 slices: whole slices on 16 SMs at m = 256 and on 3 (8 a block,
  // the ring wrapping), stripes of half a slice with deposits on all SMs at m = 1000, early deposits on 5 at m = 100.
  for (ActType act : {ActType::F16, ActType::BF16})
    for (int64_t g : kGroups) {
      const Layer tri = make_layer(rng, 1024, 1536, g, act);
      for (int sms : {0, 3, 5, 16})
        for (int64_t m : {int64_t(1), int64_t(17), int64_t(100), int64_t(128), int64_t(256), int64_t(1000)}) {
          if (act == ActType::BF16 && m != 100 && m != 1000) continue;
          run_case(tri, m, rng, producer(128, sms, 48, kernels::kWgmmaTriTileN));
        }
    }
  // Finishers that fetch the other block's deposit through the ring (takes_early_deposits).
  for (ActType act : {ActType::F16, ActType::BF16})
    for (int64_t g : kGroups) {
      const Layer wide = make_layer(rng, 512, 2048, g, act);
      for (const auto& [sms, m] : kEarlyCases) {
        REQUIRE(takes_early_deposits(m, wide.n, wide.k, sms));
        run_case(wide, m, rng, producer(kernels::kEarlyDepositRows, sms, 48));
      }
    }
}

// The producer kernel's pair form (kernels/marlin_dispatch.h, wgmma_pair_tiles): on num_sms SMs chosen so that the
// rule holds, every tile is split in two along k and each pair of blocks is one cluster that adds its halves
// through distributed shared memory. Tokens past m in the last row chunk, every group size, both activation types.
// Layers with n % 256 != 0 (n % 128 == 0) on the Hopper kernel above m = 64, on its tiles 128 columns wide: 128 x 128
// (the k-split at one row chunk), the fit tiles from m = 129 and 128 x 192 where n % 192 == 0 (384 and 1152 wide). A
// small layer on every group size, both types and few SMs; then Qwen2.5-0.5B's and Gemma-3-1B's narrow layers.
TEST_CASE("marlin: Hopper wgmma kernel on layers 128 columns wide", "[gpu][marlin][wgmma]") {
  if (!marlin_wgmma_available()) {
    WARN("skipped: no compute capability 9.0 device, or no sm_90a code in this build");
    return;
  }
  std::mt19937_64 rng(kSeed + 24);
  for (ActType act : {ActType::F16, ActType::BF16})
    for (int64_t g : kGroups) {
      const Layer L = make_layer(rng, 512, 384, g, act);
      for (int sms : {0, 5})
        for (int64_t m : {int64_t(65), int64_t(100), int64_t(129), int64_t(200), int64_t(300), int64_t(513),
                          int64_t(1000)})
          run_case(L, m, rng, producer(0, sms, 48));  // path Wgmma, the launcher's own tiles
    }
  const int64_t layers[][2] = {{896, 896}, {896, 1152}, {4864, 896}, {1152, 1152}, {6912, 1152}};
  for (auto& kn : layers) {
    const Layer L = make_layer(rng, kn[0], kn[1], 128, ActType::F16);
    for (int64_t m : {int64_t(65), int64_t(128), int64_t(200), int64_t(384), int64_t(1000)})
      run_case(L, m, rng, producer(0, 0, 32));
  }
}

// The same 128-column tiles on a layer with n % 256 != 0 under the sanitizers: the k-split, fit tiles and 128 x 192.
TEST_CASE("marlin: Hopper wgmma kernel on a 384-wide layer under the sanitizers", "[gpu][marlin][wgmma][sanitize]") {
  if (!marlin_wgmma_available()) {
    WARN("skipped: no compute capability 9.0 device, or no sm_90a code in this build");
    return;
  }
  std::mt19937_64 rng(kSeed + 25);
  const Layer L = make_layer(rng, 512, 384, 64, ActType::F16);
  for (int sms : {0, 5})
    for (int64_t m : {int64_t(100), int64_t(200), int64_t(300)}) run_case(L, m, rng, producer(0, sms, 16));
}

TEST_CASE("marlin: Hopper wgmma kernel, tiles split in two as clusters", "[gpu][marlin][wgmma]") {
  if (!marlin_wgmma_available()) {
    WARN("skipped: no compute capability 9.0 device, or no sm_90a code in this build");
    return;
  }
  std::mt19937_64 rng(kSeed + 17);
  // 1024 x 768: 3 slices of 256, 16 k-tiles. Tiles (par x 3) x 2 blocks = the SMs, or 90% of them.
  const PairCase cases[] = {{100, 6}, {128, 6}, {250, 12}, {300, 19}, {1000, 48}};
  for (ActType act : {ActType::F16, ActType::BF16})
    for (int64_t g : kGroups) {
      if (act == ActType::BF16 && g != 128) continue;
      const Layer L = make_layer(rng, 1024, 768, g, act);
      for (const PairCase& pc : cases) {
        INFO("pair case m " << pc.m << " sms " << pc.sms);
        REQUIRE(kernels::wgmma_pair_tiles(int(pc.m), int(L.n), int(L.k), kernels::kWgmmaPairRows, pc.sms));
        run_case(L, pc.m, rng, producer(kernels::kWgmmaPairRows, pc.sms, 48));
      }
      // The wide tile's pairs: 6 slices of 128 x ceil(m / 256) row chunks x 2 blocks.
      for (const PairCase& pc : kWidePairCases) {
        INFO("wide pair case m " << pc.m << " sms " << pc.sms);
        REQUIRE(kernels::wgmma_pair_tiles(int(pc.m), int(L.n), int(L.k), kernels::kWgmmaWideRows, pc.sms));
        run_case(L, pc.m, rng, producer(kernels::kWgmmaWideRows, pc.sms, 48));
      }
      for (const FitPairCase& fc : kFitPairCases) {
        INFO("fit pair case rows " << fc.rows << " m " << fc.m << " sms " << fc.sms);
        REQUIRE(kernels::wgmma_pair_tiles(int(fc.m), int(L.n), int(L.k), fc.rows, fc.sms));
        run_case(L, fc.m, rng, producer(fc.rows, fc.sms, 48));
      }
    }
}

// The producer kernel's k-split (kernels/marlin_partition.h, wgmma_split_parts): each slice in 4 to 64 parts of one
// block each; every block deposits its partial tile and the owner of each share of 8-token row groups
// adds and writes them. Against the reference within the gate, and where the stripes it replaces cut the same parts
// (split_parts_of), against the in-order finisher's output (wgmma_split = false, the same activations) bit for bit.
// Among the cases: one live group (m = 1), fewer live groups than blocks (m = 7, 33, 40), 32, 48, 64 and 128 x 256,
// 128 x 128 and fit (160 and 208 x 128) tiles (those built with a split form), parts of unequal depth (20 SMs: 16 tiles
// in six parts), and 64 blocks a slice on the whole device (the counter's re-arm after eight owners).
TEST_CASE("marlin: Hopper wgmma kernel, slices split in parts finished together", "[gpu][marlin][wgmma]") {
  if (!marlin_wgmma_available()) {
    WARN("skipped: no compute capability 9.0 device, or no sm_90a code in this build");
    return;
  }
  std::mt19937_64 rng(kSeed + 19);
  struct SplitCase { int64_t k, n; int rows; int64_t m; int sms; int tn = 0; };  // sms 0: the whole device
  constexpr int k128 = kernels::kWgmmaWideTileN;
  const SplitCase cases[] = {{1024, 768, 64, 1, 12},    {1024, 768, 64, 7, 24},    {1024, 768, 64, 40, 24},
                             {1024, 768, 64, 64, 48},   {1024, 768, 128, 100, 12}, {1024, 768, 128, 128, 48},
                             {1024, 768, 64, 17, 20},   {1024, 768, 128, 100, 20}, {4096, 512, 64, 33, 0},
                             {4096, 512, 64, 64, 0},    {1024, 768, 128, 100, 24, k128}, {1024, 768, 128, 65, 48, k128},
                             {1024, 768, 160, 150, 24}, {1024, 768, 208, 200, 24}, {1024, 768, 32, 17, 24},
                             {1024, 768, 32, 32, 12},   {4096, 512, 32, 20, 0},    {1024, 768, 48, 40, 24},
                             {4096, 512, 48, 48, 0}};
  int same_cut_cases = 0;
  for (ActType act : {ActType::F16, ActType::BF16})
    for (int64_t g : {int64_t(-1), int64_t(32), int64_t(128)}) {
      if (act == ActType::BF16 && g != 128) continue;
      const Layer shallow = make_layer(rng, 1024, 768, g, act), deep = make_layer(rng, 4096, 512, g, act);
      for (const SplitCase& sc : cases) {
        const Layer& L = sc.k == shallow.k ? shallow : deep;
        const int sms = sc.sms > 0 ? sc.sms : ctx().sms;
        INFO("split case rows " << sc.rows << " tn " << sc.tn << " m " << sc.m << " k " << sc.k << " n " << sc.n << " sms " << sms);
        bool same_cuts = false;
        REQUIRE(split_parts_of(sc.m, L.n, L.k, sc.rows, sms, sc.tn, &same_cuts) >= kernels::kSpreadMinParts);
        RunOpts o = producer(sc.rows, sc.sms, 48, sc.tn);
        const std::vector<uint16_t> A = random_A(rng, sc.m, L.k, L.act);
        const std::vector<uint16_t> C = gemm_out(L, A, o);
        check_rows(L, A, C, rng, o);
        if (!same_cuts) continue;
        ++same_cut_cases;
        o.wgmma_split = false;
        const std::vector<uint16_t> C_stripes = gemm_out(L, A, o);
        size_t differ = 0;
        for (size_t i = 0; i < C.size(); ++i) differ += C[i] == C_stripes[i] ? 0 : 1;
        INFO(differ << " of " << C.size() << " outputs differ from the in-order finisher's");
        REQUIRE(differ == 0);
      }
    }
  REQUIRE(same_cut_cases >= 20);
}

// The operand maps under the Hopper kernel, alone on the device: small integers make every product and
// sum exact, so D must equal A B^T bit for bit. A failure here (and not in the CPU model) means the
// PTX-derived model of wgmma's fragments, descriptor or swizzle is wrong; a kernel failure with this
// passing points at the kernel's pipeline.
TEST_CASE("marlin: wgmma operand maps on the device (probe)", "[gpu][marlin][wgmma][sanitize]") {
  if (!marlin_wgmma_available()) {
    WARN("skipped: no compute capability 9.0 device, or no sm_90a code in this build");
    return;
  }
  std::mt19937_64 rng(kSeed + 12);
  std::uniform_int_distribution<int> small(-4, 4);
  Ctx& c = ctx();
  for (int n : {8, 16, 32, 64, 128}) {
    std::vector<uint16_t> A(64 * 64), B(size_t(n) * 64);
    std::vector<float> Af(A.size()), Bf(B.size());
    for (size_t i = 0; i < A.size(); ++i) Af[i] = float(small(rng)), A[i] = float_to_half(Af[i]);
    for (size_t i = 0; i < B.size(); ++i) Bf[i] = float(small(rng)), B[i] = float_to_half(Bf[i]);
    DevBuf<uint16_t> dA, dB;
    DevBuf<float> dD;
    dA.resize(A.size());
    dB.resize(B.size());
    dD.resize(size_t(64) * n);
    CUDA_OK(cudaMemcpy(dA.p, A.data(), A.size() * 2, cudaMemcpyHostToDevice));
    CUDA_OK(cudaMemcpy(dB.p, B.data(), B.size() * 2, cudaMemcpyHostToDevice));
    CUDA_OK(cudaMemset(dD.p, 0xff, size_t(64) * n * 4));
    CUDA_OK(marlin_wgmma_probe(dA.p, dB.p, dD.p, n, c.stream));
    CUDA_OK(cudaStreamSynchronize(c.stream));
    std::vector<float> D(size_t(64) * n);
    CUDA_OK(cudaMemcpy(D.data(), dD.p, D.size() * 4, cudaMemcpyDeviceToHost));
    size_t wrong = 0;
    for (int r = 0; r < 64; ++r)
      for (int t = 0; t < n; ++t) {
        float want = 0.f;
        for (int k = 0; k < 64; ++k) want += Af[size_t(r) * 64 + k] * Bf[size_t(t) * 64 + k];
        wrong += D[size_t(r) * n + t] == want ? 0 : 1;
      }
    INFO("n " << n << ": " << wrong << " of " << 64 * n << " outputs differ from A B^T");
    REQUIRE(wrong == 0);
  }
}

TEST_CASE("marlin: Hopper wgmma kernel under the sanitizers", "[gpu][marlin][wgmma][sanitize]") {
  if (!marlin_wgmma_available()) {
    WARN("skipped: no compute capability 9.0 device, or no sm_90a code in this build");
    return;
  }
  std::mt19937_64 rng(kSeed + 10);
  for (int64_t g : {int64_t(-1), int64_t(32)}) {
    const Layer L = make_layer(rng, 512, 512, g, ActType::F16);
    for (int rows : {8, 32, 48, 64, 128, kernels::kWgmmaWideRows})
      for (int pipeline : {1, 2})
        for (int sms : {0, 2})
          for (int64_t m : {int64_t(7), int64_t(100), int64_t(300)}) {
            // 32 rows: both forms; 64 rows: the producer kernel's form; 48 and 256: its only ones. 300 tokens: two
            // wide row chunks.
            if (pipeline == 2 ? rows < 32 : rows == 48 || rows == 64 || rows == kernels::kWgmmaWideRows) continue;
            if (m == 300 && rows != kernels::kWgmmaWideRows) continue;
            RunOpts o;
            o.path = MarlinPath::Wgmma;
            o.wgmma_rows = rows;
            o.wgmma_pipeline = pipeline;
            o.num_sms = sms;
            run_case(L, m, rng, o);
          }
    // The pair form (tiles split in two as clusters: 2 slices x par row chunks x 2 blocks = the SMs).
    for (int64_t m : {int64_t(100), int64_t(200)}) {
      const int sms = m == 100 ? 4 : 8;
      REQUIRE(kernels::wgmma_pair_tiles(int(m), int(L.n), int(L.k), kernels::kWgmmaPairRows, sms));
      run_case(L, m, rng, producer(kernels::kWgmmaPairRows, sms));
    }
    // 128 x 128 tiles: 4 slices, one and three row chunks, stripes across slices on 2 SMs.
    for (int64_t m : {int64_t(100), int64_t(300)})
      for (int sms : {0, 2}) run_case(L, m, rng, producer(128, sms, 1 << 30, kernels::kWgmmaWideTileN));
    // 128 x 192 tiles, 8 slices: stripes with deposits on 16 SMs and at m = 100 on 3, whole slices (8 a block) at
    // m = 300 on 3.
    const Layer tri = make_layer(rng, 512, 1536, g, ActType::F16);
    for (int64_t m : {int64_t(100), int64_t(300)})
      for (int sms : {3, 16}) run_case(tri, m, rng, producer(128, sms, 1 << 30, kernels::kWgmmaTriTileN));
    // The fit tiles: one and two row chunks, the last one short (its own activation box).
    for (int rows : {144, 176, 208, 240})
      for (int64_t m : {int64_t(100), int64_t(300)}) run_case(L, m, rng, producer(rows, m == 100 ? 2 : 0));
    // The wide tile's pairs: 4 slices of 128 x ceil(m / 256) row chunks x 2 blocks.
    for (int64_t m : {int64_t(100), int64_t(300)}) {
      const int sms = m == 100 ? 8 : 16;
      REQUIRE(kernels::wgmma_pair_tiles(int(m), int(L.n), int(L.k), kernels::kWgmmaWideRows, sms));
      run_case(L, m, rng, producer(kernels::kWgmmaWideRows, sms));
    }
    // The fit tiles' pairs: 4 slices of 128 x one (144 rows, m = 100) or two (176, m = 300) row chunks x 2 blocks.
    for (auto [rows, m, sms] : {std::tuple{144, int64_t(100), 8}, std::tuple{176, int64_t(300), 16}}) {
      REQUIRE(kernels::wgmma_pair_tiles(int(m), int(L.n), int(L.k), rows, sms));
      run_case(L, m, rng, producer(rows, sms));
    }
    // Finishers that fetch the other block's deposit through the ring (takes_early_deposits).
    const Layer wide = make_layer(rng, 512, 2048, g, ActType::F16);
    for (const auto& [sms, m] : kEarlyCases) {
      REQUIRE(takes_early_deposits(m, wide.n, wide.k, sms));
      run_case(wide, m, rng, producer(kernels::kEarlyDepositRows, sms));
    }
    // Slices split in parts finished together (split_parts_of): 2 slices of 8 tiles in eight parts on 16 SMs (64-,
    // 48- and 32-row tiles), 128-row tiles in four on 8 and in five parts of 1-2 tiles on 10 (m = 30: four live row
    // groups); 4 slices of 128 x 128 in four parts on 16.
    for (auto [rows, m, sms, tn] : {std::tuple{64, int64_t(7), 16, 0}, std::tuple{32, int64_t(30), 16, 0},
                                    std::tuple{48, int64_t(40), 16, 0},
                                    std::tuple{128, int64_t(100), 8, 0},
                                    std::tuple{128, int64_t(30), 10, 0},
                                    std::tuple{128, int64_t(100), 16, kernels::kWgmmaWideTileN}}) {
      REQUIRE(split_parts_of(m, L.n, L.k, rows, sms, tn) >= kernels::kSpreadMinParts);
      run_case(L, m, rng, producer(rows, sms, 1 << 30, tn));
    }
  }
}

// The streaming m <= 16 kernel (sm_90a, one block per SM, TMA ring): every slice width, group size and
// m up to 16, stripes that cross slices (few SMs: fp32 partial tiles, the in-order finisher) and a ring
// that wraps many times (one SM walks every slice). Auto takes it on the full-size Llama layers of the
// "layer shapes" case below. Skipped on other GPUs.
TEST_CASE("marlin: streaming kernel for m <= 16", "[gpu][marlin][stream]") {
  if (!marlin_wgmma_available()) {
    WARN("skipped: no compute capability 9.0 device, or no sm_90a code in this build");
    return;
  }
  std::mt19937_64 rng(kSeed + 14);
  for (ActType act : {ActType::F16, ActType::BF16})
    for (int64_t g : kGroups) {
      const Layer L = make_layer(rng, 1024, 768, g, act);
      for (int tn : {64, 128, 256})
        for (int sms : {0, 1, 3})
          // m <= 8 takes the swapped form (kStreamSwapMaxM), 9-16 the 16-token one.
          for (int64_t m : {int64_t(1), int64_t(2), int64_t(7), int64_t(8), int64_t(9), int64_t(16)}) {
            if (act == ActType::BF16 && m != 7 && m != 9) continue;
            RunOpts o;
            o.path = MarlinPath::Stream;
            o.thread_n = tn;
            o.num_sms = sms;
            run_case(L, m, rng, o);
          }
    }
  // Whole-k slices and k-split slices (kernels/marlin_dispatch.h, stream_plan): three 256-wide slices on
  // three SMs, two slices split in two on five SMs, two 128-wide slices split in two on four, and the
  // chosen width (four whole-k slices of 128 on five SMs). Rounds (more slices than SMs): ten slices of 128
  // on three SMs (three rounds, then one slice in three parts), and the loop above on one and three SMs.
  // Stripes: six one-stage slices of 128 on five SMs, where rounds would fill 60%. The slices split in two
  // (on five and four SMs) run as clusters whose partner adds its sums through the finisher's shared memory
  // (the CLUSTER form, kernels/marlin.cu kStreamClusterSplit); the other splits deposit in the workspace. The plan's
  // own width on 32 SMs: eight 64-column slices in four parts (stream_fewest_parts, over 128 x 8 and 256 x 16).
  const struct { int64_t k, n; int sms, tn; ActType act; int64_t g; } splits[] = {
      {1024, 768, 3, 256, ActType::F16, 128}, {1024, 512, 5, 256, ActType::F16, -1},
      {2048, 256, 4, 128, ActType::BF16, 32}, {1024, 512, 5, 0, ActType::F16, 64},
      {2048, 1280, 3, 128, ActType::F16, 128}, {256, 768, 5, 128, ActType::F16, 32},
      {1024, 256, 8, 64, ActType::F16, 128}, {2048, 192, 7, 64, ActType::BF16, 64},
      {2048, 512, 32, 0, ActType::F16, 128}, {2048, 512, 32, 0, ActType::BF16, -1}};
  for (const auto& c : splits) {
    const Layer Ls = make_layer(rng, c.k, c.n, c.g, c.act);
    for (int64_t m : {int64_t(1), int64_t(16)}) {
      RunOpts o;
      o.path = MarlinPath::Stream;
      o.thread_n = c.tn;
      o.num_sms = c.sms;
      run_case(Ls, m, rng, o);
    }
  }
  const Layer big = make_layer(rng, 4096, 1024, 32, ActType::F16);
  for (int sms : {1, 5})
    for (int tn : {128, 256}) {
      RunOpts o;
      o.path = MarlinPath::Stream;
      o.thread_n = tn;
      o.num_sms = sms;
      run_case(big, 16, rng, o);
    }
}

TEST_CASE("marlin: streaming kernel under the sanitizers", "[gpu][marlin][stream][sanitize]") {
  if (!marlin_wgmma_available()) {
    WARN("skipped: no compute capability 9.0 device, or no sm_90a code in this build");
    return;
  }
  std::mt19937_64 rng(kSeed + 15);
  for (int64_t g : {int64_t(-1), int64_t(32)}) {
    const Layer L = make_layer(rng, 512, 512, g, ActType::F16);
    for (int tn : {64, 128, 256})
      for (int sms : {0, 2})
        for (int64_t m : {int64_t(1), int64_t(16)}) {
          RunOpts o;
          o.path = MarlinPath::Stream;
          o.thread_n = tn;
          o.num_sms = sms;
          run_case(L, m, rng, o);
        }
  }
  const Layer Ls = make_layer(rng, 1024, 512, 128, ActType::F16);  // two slices split in two on four SMs: clusters
  RunOpts o;
  o.path = MarlinPath::Stream;
  o.thread_n = 256;
  o.num_sms = 4;
  for (int64_t m : {int64_t(7), int64_t(12)}) run_case(Ls, m, rng, o);  // the swapped and the 16-token form
  const Layer L64 = make_layer(rng, 1024, 256, 64, ActType::F16);  // four 64-column slices in halves on eight SMs
  o.thread_n = 64;
  o.num_sms = 8;
  for (int64_t m : {int64_t(5), int64_t(16)}) run_case(L64, m, rng, o);
}

TEST_CASE("marlin: bf16 activations and scales", "[gpu][marlin]") {
  std::mt19937_64 rng(kSeed + 3);
  for (int64_t g : kGroups) {
    const Layer L = make_layer(rng, 2048, 512, g, ActType::BF16);
    for (int64_t m : {int64_t(1), int64_t(7), int64_t(17), int64_t(64), int64_t(100), int64_t(256)}) {
      RunOpts o;
      o.max_ref_rows = 32;
      run_case(L, m, rng, o);
    }
  }
}

// The dequantize kernel (one warp per 16 x 64 packed block) on every group size and both types, from a single 64-column
// tile up; small enough for the sanitizers.
TEST_CASE("marlin: dequantize kernel on every group size", "[gpu][marlin][sanitize]") {
  std::mt19937_64 rng(kSeed + 22);
  for (ActType act : {ActType::F16, ActType::BF16})
    for (int64_t g : kGroups)
      for (auto kn : {std::pair<int64_t, int64_t>{128, 64}, std::pair<int64_t, int64_t>{384, 192},
                      std::pair<int64_t, int64_t>{128, 320}, std::pair<int64_t, int64_t>{1024, 512}}) {
        if (g != -1 && kn.first % g != 0) continue;
        INFO("k " << kn.first << " n " << kn.second << " group " << g);
        const Layer L = make_layer(rng, kn.first, kn.second, g, act);
        RunOpts o;
        o.path = MarlinPath::DequantCublas;
        for (int64_t m : {int64_t(1), int64_t(37)}) run_case(L, m, rng, o);
      }
}

TEST_CASE("marlin: dequantize + cuBLAS path and the automatic dispatch", "[gpu][marlin]") {
  std::mt19937_64 rng(kSeed + 4);
  for (ActType act : {ActType::F16, ActType::BF16})
    for (int64_t g : {int64_t(-1), int64_t(128)}) {
      const Layer L = make_layer(rng, 4096, 1024, g, act);
      for (int64_t m : {int64_t(1), int64_t(100), int64_t(256), int64_t(1000)}) {
        RunOpts o;
        o.max_ref_rows = 16;
        o.path = MarlinPath::DequantCublas;
        run_case(L, m, rng, o);
        o.path = MarlinPath::Auto;
        run_case(L, m, rng, o);
      }
      // Auto's fit tiles (marlin_dispatch.h, wgmma_fit_rows): 1 x 144 (where the two launches below ran before),
      // 1 x 160, 1 x 192, 2 x 144, 2 x 160 and 3 x 240 rows.
      for (int64_t m : {int64_t(129), int64_t(150), int64_t(180), int64_t(272), int64_t(300), int64_t(700)}) {
        REQUIRE(kernels::wgmma_fit_rows(int(m)) > 0);
        REQUIRE(kernels::auto_split_head(int(m)) == 0);
        run_case(L, m, rng, auto_pick(0, 64));
      }
      // On 64 SMs one chunk of 208 rows would cut each of the 8 slices in 8 parts: two 128-row chunks instead
      // (wgmma_fit_split_deep).
      REQUIRE(kernels::wgmma_fit_plan(200, int(L.n), int(L.k), 64) == 0);
      run_case(L, 200, rng, auto_pick(64, 64));
      // Auto's fit tiles in more chunks where those give each block whole column slices (wgmma_fit_plan): one a
      // block on 33 SMs (4 x 144, 4 x 160, 4 x 176 rows against 3 x 192, 5 x 128 and 3 x 240), two on 16.
      for (auto [m, sms] : {std::pair{560, 33}, std::pair{640, 33}, std::pair{700, 33}, std::pair{700, 16}}) {
        INFO("m " << m << " on " << sms << " SMs");
        REQUIRE(kernels::wgmma_fit_plan(m, int(L.n), int(L.k), sms) != kernels::wgmma_fit_rows(m));
        run_case(L, m, rng, auto_pick(sms, 64));
      }
      // The Hopper kernel's own 128 x 192 tiles (wgmma_prefer_192) on 8 slices of 192: one whole slice a block, the
      // last row chunk 22, 128, 1 and 116 rows. Path Wgmma where it runs: Auto gives this 1.6 M-weight layer to
      // dequantize + cuBLAS at m = 129-896 (kWgmmaTinyDqMaxLayer), and the launcher picks the tiles the same way.
      const Layer T = make_layer(rng, 1024, 1536, g, act);
      for (auto [m, sms] : {std::pair{150, 17}, std::pair{256, 17}, std::pair{385, 34}, std::pair{500, 33}}) {
        INFO("m " << m << " on " << sms << " SMs");
        REQUIRE(kernels::wgmma_prefer_192(m, int(T.n), int(T.k), sms));
        RunOpts o = auto_pick(sms, 64);
        if (marlin_wgmma_available()) o.path = MarlinPath::Wgmma;
        run_case(T, m, rng, o);
      }
      // m just past whole 128-row chunks beyond the fit tiles: Auto's two launches (marlin_dispatch.h,
      // auto_split_head), every row checked, on a smaller layer.
      const Layer S = make_layer(rng, 1024, 512, g, act);
      for (int64_t m : {int64_t(1025), int64_t(1040)}) {
        REQUIRE(kernels::auto_split_head(int(m)) > 0);
        RunOpts o;
        o.path = MarlinPath::Auto;
        run_case(S, m, rng, o);
      }
    }
}

namespace {
// Auto on one layer at each m of `ms`, checked against the packed bytes once (the first m) and the direct float64
// sum after.
void run_auto_ms(const Layer& L, std::initializer_list<int64_t> ms, std::mt19937_64& rng) {
  bool first = true;
  for (int64_t m : ms) {
    RunOpts o;
    o.max_ref_rows = kMaxRefRows;
    o.packed_reference = first;
    o.path = MarlinPath::Auto;
    run_case(L, m, rng, o);
    first = false;
  }
}
}  // namespace

TEST_CASE("marlin: Llama-3-8B and 70B layer shapes", "[gpu][marlin][llama]") {
  std::mt19937_64 rng(kSeed + 5);
  const int64_t layers[][2] = {{4096, 6144}, {4096, 4096}, {4096, 28672}, {14336, 4096},
                               {8192, 10240}, {8192, 8192}, {8192, 57344}, {28672, 8192}};
  for (auto& kn : layers) {
    const Layer L = make_layer(rng, kn[0], kn[1], 128, ActType::F16);
    run_auto_ms(L, {1, 16, 33, 64, 128, 256, 1000}, rng);
    // Fused kernel at large m too (row chunks > 1), whatever Auto would pick.
    RunOpts o;
    o.max_ref_rows = kMaxRefRows;
    o.packed_reference = false;
    run_case(L, 256, rng, o);
  }
  for (auto& kn : {layers[1], layers[7]}) {
    const Layer L = make_layer(rng, kn[0], kn[1], -1, ActType::F16);
    for (int64_t m : {int64_t(1), int64_t(64)}) {
      RunOpts o;
      o.max_ref_rows = kMaxRefRows;
      o.packed_reference = false;
      run_case(L, m, rng, o);
    }
  }
}

// The narrower layers of other models (bench_marlin's llama3.2-1b, llama3.2-3b, qwen2.5-7b and qwen2.5-32b sets),
// where Auto streams at m <= 16 with plans the Llama-3 layers do not take: 64-column slices in halves below 2^24
// weights, 128- or 64-column slices in three or four parts (kernels/marlin_dispatch.h, stream_fewest_parts).
TEST_CASE("marlin: other models' narrow layer shapes", "[gpu][marlin][models]") {
  std::mt19937_64 rng(kSeed + 21);
  const int64_t layers[][2] = {{2048, 3072}, {2048, 2048}, {8192, 2048}, {3072, 3072}, {3072, 5120},
                               {3584, 4608}, {3584, 3584}, {5120, 5120}, {2048, 16384}};
  for (auto& kn : layers) {
    const Layer L = make_layer(rng, kn[0], kn[1], 128, ActType::F16);
    // m = 432: 128 x 128 tiles on the four shallowest (marlin_dispatch.h, wgmma_fit_split_shallow).
    run_auto_ms(L, {1, 8, 9, 16, 64, 200, 432}, rng);
  }
  const Layer L = make_layer(rng, 3584, 4608, 64, ActType::BF16);
  run_auto_ms(L, {3, 12}, rng);
  // Small models' layers (Qwen2.5-0.5B, Gemma-3-1B, Qwen3-0.6B, Qwen2.5-1.5B): the mma.sync kernel with whole
  // slices or four parts (kernels/marlin_dispatch.h, mma_auto_parts) at m <= 64, or at m <= 16 the streaming kernel's
  // 64-column stripes from 1536 deep (stream_small_stripes); dequantize + cuBLAS above m = 64 where n % 256 != 0, and
  // on the three smallest Hopper-capable ones at m = 129-896 (kWgmmaTinyDqMaxLayer), the Hopper kernel on them at
  // m = 1000.
  const int64_t small[][2] = {{896, 896}, {896, 1152}, {4864, 896}, {1024, 1152}, {1152, 1536}, {2048, 1024},
                              {1536, 1536}};
  for (auto& kn : small) {
    const Layer Ls = make_layer(rng, kn[0], kn[1], 128, ActType::F16);
    run_auto_ms(Ls, {1, 16, 32, 64, 100, 300, 600, 1000}, rng);
  }
}

TEST_CASE("marlin: the original packer's golden files", "[gpu][marlin][golden]") {
  MARLINC_REQUIRE_SHARED();
  std::mt19937_64 rng(kSeed + 6);
  for (const char* name : {"marlin_k256_n256_g128", "marlin_k256_n256_g-1", "marlin_k512_n768_g128", "marlin_k1024_n512_g-1"}) {
    INFO(name);
    const auto f = SafetensorsFile::open(test::shared_dir() / "golden" / (std::string(name) + ".safetensors"));
    const TensorInfo *tq = f.find("q"), *ts_in = f.find("s_in"), *tB = f.find("B"), *ts = f.find("s");
    REQUIRE((tq && ts_in && tB && ts));
    Layer L;
    L.k = tq->shape[0];
    L.n = tq->shape[1];
    L.group = ts->shape[0] == 1 ? -1 : L.k / ts->shape[0];
    L.act = ActType::F16;
    auto copy = [&](const TensorInfo* t, auto& v) {
      const auto bytes = f.data(*t);
      v.resize(bytes.size() / sizeof(v[0]));
      std::memcpy(v.data(), bytes.data(), bytes.size());
    };
    std::vector<int8_t> q;
    copy(tq, q);
    copy(ts_in, L.s_in);
    copy(tB, L.B);
    copy(ts, L.s);
    L.q.resize(q.size());
    for (size_t i = 0; i < q.size(); ++i) L.q[i] = uint8_t(q[i] + 8);
    for (int64_t m : {int64_t(1), int64_t(16), int64_t(17), int64_t(100)}) {
      RunOpts o;
      run_case(L, m, rng, o);  // reference from the golden packed bytes
      o.packed_reference = false;
      run_case(L, m, rng, o);  // and from the golden q, s_in directly
    }
  }
}

TEST_CASE("marlin: argument checks return a status", "[gpu][marlin]") {
  Ctx& c = ctx();
  c.A.resize(1024);
  c.B.resize(4096);  // the streaming kernel's Ok case below reads 128 x 256 packed weights
  c.s.resize(1024);
  c.C.resize(1024);
  MarlinGemm g;
  g.A = c.A.p; g.B = c.B.p; g.s = c.s.p; g.C = c.C.p;
  g.m = 1; g.n = 64; g.k = 128; g.group_size = 128;
  g.workspace = c.ws.p;
  g.workspace_bytes = c.ws.n;
  g.stream = c.stream;
  MarlinGemm b = g;
  b.k = 96;
  REQUIRE(marlin_gemm(b) == MarlinStatus::BadShape);
  b = g;
  b.n = 96;
  REQUIRE(marlin_gemm(b) == MarlinStatus::BadShape);
  b = g;
  b.m = 0;
  REQUIRE(marlin_gemm(b) == MarlinStatus::BadShape);
  b = g;
  b.group_size = 16;
  REQUIRE(marlin_gemm(b) == MarlinStatus::BadGroupSize);
  b = g;
  b.A = reinterpret_cast<const char*>(g.A) + 2;
  REQUIRE(marlin_gemm(b) == MarlinStatus::BadAlignment);
  b = g;
  b.workspace_bytes = 16;
  REQUIRE(marlin_gemm(b) == MarlinStatus::WorkspaceTooSmall);
  for (int bad_sms : {ctx().sms + 1, 2049}) {  // more SMs than the device has: the grid would not all be resident
    b = g;
    b.num_sms = bad_sms;
    REQUIRE(marlin_gemm(b) == MarlinStatus::BadShape);
  }
  b = g;
  b.thread_k = 64;
  b.thread_n = 256;  // n = 64 is not a multiple of 256
  REQUIRE(marlin_gemm(b) == MarlinStatus::NoConfig);
  for (int bad_mb : {-1, 5}) {  // m tiles are 1..4 blocks of 16 rows
    b = g;
    b.thread_m_blocks = bad_mb;
    REQUIRE(marlin_gemm(b) == MarlinStatus::NoConfig);
  }
  b = g;
  b.mma_parts = -1;
  REQUIRE(marlin_gemm(b) == MarlinStatus::NoConfig);
  for (int bad_rows : {-1, 24, 96, 136, 248, 512}) {  // Hopper token tiles: 8-128 in powers of 2, 48, 144-256 by 16
    b = g;
    b.wgmma_rows = bad_rows;
    REQUIRE(marlin_gemm(b) == MarlinStatus::NoConfig);
  }
  for (int bad_pipeline : {-1, 3}) {  // 0 (chosen), 1 (block barrier), 2 (producer warpgroup)
    b = g;
    b.wgmma_pipeline = bad_pipeline;
    REQUIRE(marlin_gemm(b) == MarlinStatus::NoConfig);
  }
  b = g;
  b.path = MarlinPath::Wgmma;  // n = 64 is not a multiple of 256 (and elsewhere than 9.0 nothing runs)
  REQUIRE(marlin_gemm(b) == MarlinStatus::NoConfig);
  b.n = 384;  // n % 256 != 0: only above m = 64, on the tiles 128 columns wide
  b.m = 64;
  REQUIRE(marlin_gemm(b) == MarlinStatus::NoConfig);
  if (marlin_wgmma_available()) {  // the producer pipeline is built for the tiles of 32 rows and more only
    b = g;
    b.n = 256;
    b.path = MarlinPath::Wgmma;
    b.wgmma_rows = 16;
    b.wgmma_pipeline = 2;
    REQUIRE(marlin_gemm(b) == MarlinStatus::NoConfig);
    b.wgmma_rows = kernels::kWgmmaWideRows;  // the wide tile has the producer pipeline only
    b.wgmma_pipeline = 1;
    REQUIRE(marlin_gemm(b) == MarlinStatus::NoConfig);
    b.wgmma_rows = 48;  // and so has the 48-row tile
    REQUIRE(marlin_gemm(b) == MarlinStatus::NoConfig);
    b.wgmma_rows = 128;  // 128 x 128 tiles: the producer pipeline only, 128 rows only, widths 128 and 256 only
    b.thread_n = 128;
    REQUIRE(marlin_gemm(b) == MarlinStatus::NoConfig);
    b.wgmma_pipeline = 2;
    b.wgmma_rows = 64;
    REQUIRE(marlin_gemm(b) == MarlinStatus::NoConfig);
    b.wgmma_rows = 128;
    b.thread_n = 192;
    REQUIRE(marlin_gemm(b) == MarlinStatus::NoConfig);
    b.thread_n = 256;  // the fit tiles: 128 columns, producer pipeline only
    b.wgmma_rows = 192;
    REQUIRE(marlin_gemm(b) == MarlinStatus::NoConfig);
    b.thread_n = 0;
    b.wgmma_pipeline = 1;
    REQUIRE(marlin_gemm(b) == MarlinStatus::NoConfig);
  }
  if (marlin_wgmma_available()) {  // the streaming kernel: m <= 16, slices of 64, 128 or 256 columns
    b = g;
    b.path = MarlinPath::Stream;
    b.m = 17;
    REQUIRE(marlin_gemm(b) == MarlinStatus::NoConfig);
    b.m = 1;
    b.n = 256;
    b.thread_n = 96;
    REQUIRE(marlin_gemm(b) == MarlinStatus::NoConfig);
    b.thread_n = 64;  // slices are 128 or 256 columns wide
    REQUIRE(marlin_gemm(b) == MarlinStatus::NoConfig);
    b.thread_n = 256;
    b.k = 128;
    REQUIRE(marlin_gemm(b) == MarlinStatus::Ok);
    REQUIRE(cudaStreamSynchronize(c.stream) == cudaSuccess);
  }
  b = g;
  b.path = MarlinPath::DequantCublas;
  b.cublas = nullptr;
  REQUIRE(marlin_gemm(b) == MarlinStatus::CublasError);
}
