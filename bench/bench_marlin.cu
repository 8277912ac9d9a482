// Benchmark of marlinc's Marlin W4A16 GEMM against cuBLAS FP16, by the method of
// ../shared/spec/performance.md: cold weights (rotating copies of packed weights + scales, and of the
// FP16 weights for cuBLAS, >= 512 MB per sweep), 64 calls captured in one CUDA graph, median of 7
// replays (spread printed), cuBLAS (cublasGemmEx, fp16 in/out, fp32 accumulate) and a device-to-device
// copy bandwidth measured in the same run. Random data only. Prints per-(set, m) rows and a summary
// table last; --json PATH writes every number; --explore also times every tile configuration;
// --timeline (builds with MARLINC_TIMELINE=ON) prints per-block phase timings of each layer's auto kernel, and
// --timeline-dump DIR also writes their raw per-block records (scripts/experiments/timeline_path.py reads them).
// The fused kernel is timed twice: plainly ("serial") and with MarlinGemm::overlap_previous
// (programmatic dependent launch: each call streams its first weight tiles while the previous call
// finishes, as in a model's sequence of layers, whose weights are constant); Auto uses the latter.
// With --wgmma, on a 9.0 device, the Hopper (wgmma) kernel is timed at every m ("wgmma", with overlap;
// layers whose width it cannot take count with the mma.sync time), and wherever Auto picks it without
// the flag; --wgmma-rows forces its token tile, --wgmma-pipeline its pipeline (1 block barrier, 2 producer
// warpgroup; also for the auto column). "auto" is marlin_auto_path's pick. --sets also takes
// one-layer sets "KxN" or "KxNgG" (for ncu on one shape), and --ms any m >= 1 (buffers sized to the max).
// --host-us prints the host time of one eager marlin_gemm call per kernel path (no graph: what a caller
// that launches layer by layer pays on the CPU), first call on new arguments and repeated calls.
// --auto-only times only cuBLAS and the kernel Auto picks (A/B runs); --sms N plans and launches our
// kernels as if the device had N SMs (partition experiments); --no-wgmma-split keeps the Hopper kernel in
// stripes (MarlinGemm::wgmma_split = false); --mma-parts N caps the blocks sharing an mma.sync column slice
// (MarlinGemm::mma_parts; 1: whole slices). With --explore, m <= 16 also times the
// streaming kernel at each slice width its plan accepts. --floor also times, per layer, a kernel that only
// reads the layer's packed weights and scales (and one that only reads cuBLAS's fp16 weights), launched as
// ours are (bench/read_floor.cuh), and prints cuBLAS's time over it: the speedup a kernel that did no
// arithmetic, no reduction and no write would reach.
#include <cublas_v2.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "kernels/marlin.h"
#include "kernels/marlin_dispatch.h"
#include "bench/read_floor.cuh"

using namespace marlinc::kernels;

namespace {

constexpr size_t kRotateBytes = size_t(512) << 20;  // per sweep, weights (+ scales) of one variant
constexpr int kCalls = 64;                           // calls per captured graph
constexpr int kReplays = 7;                          // timed replays; the median is reported
constexpr int kWarmReplays = 3;                      // untimed replays before them
constexpr double kSettleSeconds = 0.25;              // untimed copies between the GEMM rate and the first layer

#define CK(x)                                                                                  \
  do {                                                                                         \
    cudaError_t e_ = (x);                                                                      \
    if (e_ != cudaSuccess) {                                                                   \
      std::fprintf(stderr, "%s failed at %s:%d: %s\n", #x, __FILE__, __LINE__, cudaGetErrorString(e_)); \
      std::exit(1);                                                                            \
    }                                                                                          \
  } while (0)
#define CB(x)                                                                       \
  do {                                                                              \
    cublasStatus_t s_ = (x);                                                        \
    if (s_ != CUBLAS_STATUS_SUCCESS) {                                              \
      std::fprintf(stderr, "%s failed at %s:%d: %d\n", #x, __FILE__, __LINE__, int(s_)); \
      std::exit(1);                                                                 \
    }                                                                               \
  } while (0)

__device__ uint64_t mix(uint64_t x) {  // splitmix64 finalizer: a counter-based random stream
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}
__global__ void fill_bits(uint32_t* p, size_t n, uint64_t seed) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x)
    p[i] = uint32_t(mix(seed * 0x100000001b3ull + i));
}
// fp16 values uniform in [lo, hi).
__global__ void fill_half(__half* p, size_t n, uint64_t seed, float lo, float hi) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x) {
    const float u = float(mix(seed * 0x100000001b3ull + i) >> 40) / float(1 << 24);
    p[i] = __float2half(lo + (hi - lo) * u);
  }
}

// 16-byte grid-stride copy: cudaMemcpyAsync D2D reached only ~80% of what a plain kernel streams on
// the H100, which made the "fraction of copy bandwidth" column read above 1.
__global__ void copy_int4(const int4* __restrict__ x, int4* __restrict__ y, size_t n) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x) y[i] = x[i];
}

struct Stats { double us, spread; };
// --soak SEC: the GEMM graphs of the table (cuBLAS and Auto) replay for SEC seconds before their timed
// replays, so that the GPU's power and clocks settle for that kernel; each soak prints its wall-clock
// window (ms since the epoch) with its label, for lining up with an `nvidia-smi -lms` log
// (scripts/experiments/power.sh).
double g_soak_s = 0;
// Speedup of a column over cuBLAS; 0 where the column was not timed (--auto-only).
double ratio(double cublas_us, double us) { return us > 0 ? cublas_us / us : 0.0; }

// soak_label: where non-empty and --soak is given, the graph soaks before it is timed (above).
Stats time_graph(cudaStream_t st, const std::function<void(int)>& call, const std::string& soak_label = {}) {
  for (int i = 0; i < kCalls; ++i) call(i);  // eager warm-up (module load, cuBLAS heuristics)
  CK(cudaStreamSynchronize(st));
  cudaGraph_t g;
  cudaGraphExec_t ge;
  CK(cudaStreamBeginCapture(st, cudaStreamCaptureModeThreadLocal));
  for (int i = 0; i < kCalls; ++i) call(i);
  CK(cudaStreamEndCapture(st, &g));
  CK(cudaGraphInstantiate(&ge, g, 0));
  // Untimed replays first: after the host-side allocations between layers the GPU has idled and its
  // clocks take a few milliseconds to come back (the first layer of a run measured up to 40% slow).
  for (int r = 0; r < kWarmReplays; ++r) CK(cudaGraphLaunch(ge, st));
  CK(cudaStreamSynchronize(st));
  if (g_soak_s > 0 && !soak_label.empty()) {
    using clk = std::chrono::system_clock;
    const auto ms_now = [] {
      return (long long)std::chrono::duration_cast<std::chrono::milliseconds>(clk::now().time_since_epoch()).count();
    };
    const long long t0 = ms_now(), end = t0 + (long long)(g_soak_s * 1000);
    while (ms_now() < end) {
      for (int r = 0; r < 4; ++r) CK(cudaGraphLaunch(ge, st));
      CK(cudaStreamSynchronize(st));
    }
    std::fprintf(stderr, "soak %s %lld %lld\n", soak_label.c_str(), t0, ms_now());
  }
  cudaEvent_t a, b;
  CK(cudaEventCreate(&a));
  CK(cudaEventCreate(&b));
  std::vector<double> t;
  for (int r = 0; r < kReplays; ++r) {
    CK(cudaEventRecord(a, st));
    CK(cudaGraphLaunch(ge, st));
    CK(cudaEventRecord(b, st));
    CK(cudaEventSynchronize(b));
    float ms = 0;
    CK(cudaEventElapsedTime(&ms, a, b));
    t.push_back(double(ms) * 1e3 / kCalls);
  }
  CK(cudaEventDestroy(a));
  CK(cudaEventDestroy(b));
  CK(cudaGraphExecDestroy(ge));
  CK(cudaGraphDestroy(g));
  std::sort(t.begin(), t.end());
  const double med = t[t.size() / 2];
  return {med, (t.back() - t.front()) / med};
}

struct Layer { int k, n; };
// --timeline: the layer's auto kernel timed again with per-block timestamps (marlin_timeline, builds
// with MARLINC_TIMELINE=ON); one line of medians over the graph's calls 8..63 (steady state):
// the period between consecutive calls' first block entries, the gap from the previous call's last
// block exit to this call's first entry (negative: the calls overlap), the spread of block entries,
// and per block (medians) entry -> past the wait for the previous kernel -> first tile in shared memory
// -> products done -> exit, and the spread of exits (last - median).
std::string timeline_line(cudaStream_t st, unsigned long long* buf, const std::function<void(int)>& call,
                          const char* set, int group, int m, int k, int n, double timed_us, const char* kernel,
                          const std::string& dump_dir) {
  const size_t words = size_t(kCalls) * kTlSlotWords;
  CK(cudaMemsetAsync(buf, 0, words * 8, st));
  marlin_timeline(buf, kCalls);
  time_graph(st, call);  // eager calls, then the graph's: the last replay's call i fills slot i
  marlin_timeline(nullptr, 0);
  std::vector<unsigned long long> h(words);
  CK(cudaMemcpy(h.data(), buf, words * 8, cudaMemcpyDeviceToHost));
  if (!dump_dir.empty()) {  // --timeline-dump: raw records of calls 30..33, ns from call 30's first entry
    char path[512];
    std::snprintf(path, sizeof path, "%s/tl_%s_g%d_m%d_k%d_n%d.csv", dump_dir.c_str(), set, group, m, k, n);
    if (FILE* f = std::fopen(path, "w")) {
      unsigned long long base = ~0ull;
      for (int b = 0; b < kTlMaxBlocks; ++b) {
        const unsigned long long e = h[size_t(30) * kTlSlotWords + size_t(b) * kTlRecord + kTlEntry];
        if (e) base = std::min(base, e);
      }
      std::fprintf(f, "call,block,entry,waited,first,computed,reduced,exit,sm,info\n");
      for (int c = 30; c < 34; ++c)
        for (int b = 0; b < kTlMaxBlocks; ++b) {
          const unsigned long long* q = h.data() + size_t(c) * kTlSlotWords + size_t(b) * kTlRecord;
          if (q[kTlEntry] == 0) continue;
          auto rel = [&](int pt) { return q[pt] ? (long long)(q[pt] - base) : -1ll; };
          std::fprintf(f, "%d,%d,%lld,%lld,%lld,%lld,%lld,%lld,%llu,%llu\n", c, b, rel(kTlEntry), rel(kTlWaited),
                       rel(kTlFirstData), rel(kTlComputed), rel(kTlReduced), rel(kTlExit), q[kTlSm], q[kTlInfo]);
        }
      std::fclose(f);
    }
  }
  auto med = [](std::vector<double> v) {
    if (v.empty()) return 0.0;
    std::sort(v.begin(), v.end());
    return v[v.size() / 2];
  };
  std::vector<double> period, gap, espread, waited, first, loop, finish, xspread;
  int blocks = 0;
  double prev_e0 = 0, prev_x1 = 0;
  for (int c = 0; c < kCalls; ++c) {
    const unsigned long long* r = h.data() + size_t(c) * kTlSlotWords;
    double e0 = 1e300, e1 = 0, x1 = 0;
    std::vector<double> w, f, l, x, xs;
    int nb = 0;
    for (int b = 0; b < kTlMaxBlocks; ++b) {
      const unsigned long long* q = r + size_t(b) * kTlRecord;
      if (q[kTlEntry] == 0 || q[kTlExit] == 0) continue;
      ++nb;
      const double e = double(q[kTlEntry]), ex = double(q[kTlExit]);
      e0 = std::min(e0, e), e1 = std::max(e1, e), x1 = std::max(x1, ex);
      xs.push_back(ex);
      if (q[kTlWaited]) w.push_back(double(q[kTlWaited]) - e);
      if (q[kTlFirstData]) f.push_back(double(q[kTlFirstData]) - double(q[kTlWaited] ? q[kTlWaited] : q[kTlEntry]));
      if (q[kTlComputed] && q[kTlFirstData]) l.push_back(double(q[kTlComputed]) - double(q[kTlFirstData]));
      if (q[kTlComputed]) x.push_back(ex - double(q[kTlComputed]));
    }
    if (nb == 0) return std::string("timeline: no records (this build was configured without MARLINC_TIMELINE=ON)\n");
    blocks = nb;
    if (c >= 8) {
      period.push_back(e0 - prev_e0), gap.push_back(e0 - prev_x1), espread.push_back(e1 - e0);
      waited.push_back(med(w)), first.push_back(med(f)), loop.push_back(med(l)), finish.push_back(med(x));
      xspread.push_back(x1 - med(xs));
    }
    prev_e0 = e0, prev_x1 = x1;
  }
  char line[512];
  std::snprintf(line, sizeof line,
                "timeline %s g%d m%d k%d n%d %s: timed %.2f us | period %.2f | gap %.2f | entry spread %.2f | "
                "blocks %d | wait %.2f | first data %.2f | products %.2f | reduce+exit %.2f | exit spread %.2f\n",
                set, group, m, k, n, kernel, timed_us, med(period) / 1e3, med(gap) / 1e3, med(espread) / 1e3, blocks,
                med(waited) / 1e3, med(first) / 1e3, med(loop) / 1e3, med(finish) / 1e3, med(xspread) / 1e3);
  return line;
}

struct LayerSet { const char* name; int group; std::vector<Layer> layers; };

struct Row {
  std::string set;
  int group, m;
  // Summed over the set's layers, µs. fused: the fused kernel with overlap_previous (programmatic
  // dependent launch, as a serving engine would call it); serial: the same kernel without it.
  double cublas = 0, fused = 0, serial = 0, dq = 0, wg = 0, autop = 0;
  double bytes = 0, flops = 0;
  double spread = 0;
  // --floor: the read-only kernel over the same bytes (m-independent; bench/read_floor.cuh). read: the fastest
  // of its configurations with our kernels' residency (one or two blocks per SM); read_free: with no residency
  // limit; read16: the same as read over cuBLAS's fp16 weights.
  double read = 0, read_free = 0, read16 = 0;
  std::string configs;
  std::string layers_json;  // per layer: [k, n, cuBLAS µs, fused µs, serial µs, dq+cuBLAS µs, wgmma µs, auto µs]
};

}  // namespace

// Host microseconds per eager marlin_gemm call on an 8B o-sized layer (4096 x 4096, g128): "new" is the
// first call on each of kFresh distinct activation buffers (the TMA paths encode their maps there),
// "repeat" the best of 5 rounds of kRepeat calls on one buffer. The stream is drained between rounds so
// that launches never wait for queue space.
void host_cost(cudaStream_t st, void* ws, size_t ws_bytes, int sms) {
  constexpr int k = 4096, n = 4096, kFresh = 64, kRepeat = 200, kMaxM = 128;
  int32_t* B;
  __half *s, *A, *C;
  CK(cudaMalloc(&B, size_t(k) * n / 2));
  CK(cudaMalloc(&s, size_t(k / 128) * n * 2));
  CK(cudaMalloc(&A, size_t(kFresh) * kMaxM * k * 2));
  CK(cudaMalloc(&C, size_t(kMaxM) * n * 2));
  fill_bits<<<1024, 256, 0, st>>>(reinterpret_cast<uint32_t*>(B), size_t(k) * n / 8, 11);
  fill_half<<<64, 256, 0, st>>>(s, size_t(k / 128) * n, 12, 0.01f, 0.02f);
  fill_half<<<1024, 256, 0, st>>>(A, size_t(kFresh) * kMaxM * k, 13, -1.f, 1.f);
  CK(cudaStreamSynchronize(st));
  struct Case { const char* name; MarlinPath path; int m; bool hopper; };
  const Case cases[] = {{"mma.sync", MarlinPath::Marlin, 1, false}, {"stream", MarlinPath::Stream, 1, true},
                        {"wgmma", MarlinPath::Wgmma, 128, true}};
  using clk = std::chrono::steady_clock;
  for (const Case& c : cases) {
    if (c.hopper && !marlin_wgmma_available()) continue;
    MarlinGemm g;
    g.B = B; g.s = s; g.C = C; g.m = c.m; g.n = n; g.k = k; g.group_size = 128;
    g.workspace = ws; g.workspace_bytes = ws_bytes; g.stream = st; g.num_sms = sms; g.path = c.path;
    auto call = [&](int buf) {
      g.A = A + size_t(buf) * kMaxM * k;
      const MarlinStatus r = marlin_gemm(g);
      if (r != MarlinStatus::Ok) {
        std::fprintf(stderr, "host cost %s: %s\n", c.name, marlin_status_name(r));
        std::exit(1);
      }
    };
    call(0);  // prepares the kernel once per process
    CK(cudaStreamSynchronize(st));
    const auto t0 = clk::now();
    for (int i = 1; i < kFresh; ++i) call(i);
    const double fresh = std::chrono::duration<double, std::micro>(clk::now() - t0).count() / (kFresh - 1);
    CK(cudaStreamSynchronize(st));
    double repeat = 1e30;
    for (int r = 0; r < 5; ++r) {
      const auto t1 = clk::now();
      for (int i = 0; i < kRepeat; ++i) call(0);
      repeat = std::min(repeat, std::chrono::duration<double, std::micro>(clk::now() - t1).count() / kRepeat);
      CK(cudaStreamSynchronize(st));
    }
    std::printf("host us per call: %-8s m=%-3d new %.2f repeat %.2f\n", c.name, c.m, fresh, repeat);
  }
  CK(cudaFree(B));
  CK(cudaFree(s));
  CK(cudaFree(A));
  CK(cudaFree(C));
}

int main(int argc, char** argv) {
  std::vector<std::string> sets_wanted = {"llama3-8b", "llama3-70b", "large"};
  std::vector<int> ms = {1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024};
  bool explore = false;
  int sms_arg = 0;
  bool auto_only = false;
  bool wgmma_split = true;  // MarlinGemm::wgmma_split
  int mma_parts = 0;        // MarlinGemm::mma_parts (the mma.sync kernel's calls, Auto's among them)
  bool time_wgmma = false;
  int wgmma_rows = 0;  // 0: the kernel's own pick for m
  int wgmma_n = 0;     // the Hopper kernel's tile columns (MarlinGemm::thread_n on path Wgmma); 0: its own
  int wgmma_pipeline = 0;  // 0: the kernel's own pick per tile (MarlinGemm::wgmma_pipeline)
  std::string json_path;
  bool timeline = false, host_us = false, floor = false;
  int floor_tail_ns = 0;  // --floor-tail NS: the read kernel also holds each SM NS after its wait (experiment)
  std::string timeline_dump;  // --timeline-dump DIR: one csv of raw per-block records per layer and m
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--explore") explore = true;
    else if (a == "--wgmma") time_wgmma = true;
    else if (a == "--wgmma-rows" && i + 1 < argc) time_wgmma = true, wgmma_rows = std::atoi(argv[++i]);
    else if (a == "--wgmma-pipeline" && i + 1 < argc) wgmma_pipeline = std::atoi(argv[++i]);
    else if (a == "--wgmma-n" && i + 1 < argc) time_wgmma = true, wgmma_n = std::atoi(argv[++i]);
    else if (a == "--json" && i + 1 < argc) json_path = argv[++i];
    else if (a == "--timeline") timeline = true;
    else if (a == "--host-us") host_us = true;
    else if (a == "--floor") floor = true;
    else if (a == "--floor-tail" && i + 1 < argc) floor = true, floor_tail_ns = std::atoi(argv[++i]);
    else if (a == "--sms" && i + 1 < argc) sms_arg = std::atoi(argv[++i]);
    else if (a == "--auto-only") auto_only = true;
    else if (a == "--no-wgmma-split") wgmma_split = false;
    else if (a == "--mma-parts" && i + 1 < argc) mma_parts = std::atoi(argv[++i]);
    else if (a == "--soak" && i + 1 < argc) g_soak_s = std::atof(argv[++i]);
    else if (a == "--timeline-dump" && i + 1 < argc) timeline = true, timeline_dump = argv[++i];
    else if (a == "--sets" && i + 1 < argc) {
      sets_wanted.clear();
      std::string v = argv[++i];
      for (size_t p = 0; p <= v.size();) {
        size_t q = v.find(',', p);
        if (q == std::string::npos) q = v.size();
        sets_wanted.push_back(v.substr(p, q - p));
        p = q + 1;
      }
    } else if (a == "--ms" && i + 1 < argc) {
      ms.clear();
      std::string v = argv[++i];
      for (size_t p = 0; p <= v.size();) {
        size_t q = v.find(',', p);
        if (q == std::string::npos) q = v.size();
        ms.push_back(std::atoi(v.substr(p, q - p).c_str()));
        p = q + 1;
      }
    } else {
      std::fprintf(stderr,
                   "usage: bench_marlin [--sets llama3-8b,llama3-70b,large,llama3.2-1b,llama3.2-3b,qwen2.5-7b,"
                   "qwen2.5-32b,qwen2.5-1.5b,qwen2.5-0.5b,gemma3-1b,KxN[gG]] [--ms 1,16,...] [--explore]"
                   " [--wgmma] [--wgmma-rows 8|16|32|48|64|128|144-256] [--wgmma-n 128|256] [--wgmma-pipeline 1|2] [--timeline]"
                   " [--timeline-dump DIR] [--host-us] [--sms N] [--auto-only] [--no-wgmma-split] [--mma-parts N]"
                   " [--soak SEC] [--floor]"
                   " [--floor-tail NS] [--json PATH]\n");
      return 2;
    }
  }

  for (int m : ms)
    if (m < 1) {
      std::fprintf(stderr, "bench_marlin: --ms values must be >= 1 (got %d)\n", m);
      return 2;
    }
  if (ms.empty()) return 2;
  const int max_m = *std::max_element(ms.begin(), ms.end());  // activations and outputs are sized for it

  cudaDeviceProp prop;
  CK(cudaGetDeviceProperties(&prop, 0));
  cudaStream_t st;
  CK(cudaStreamCreate(&st));
  cublasHandle_t cub;
  CB(cublasCreate(&cub));
  CB(cublasSetStream(cub, st));
  // --sms N: our kernels plan and launch as if the device had N SMs (a partition experiment); cuBLAS and the
  // copy keep the whole device.
  const int sms = sms_arg > 0 && sms_arg < prop.multiProcessorCount ? sms_arg : prop.multiProcessorCount;
  std::printf("device: %s, %d SMs, L2 %d MB%s\n", prop.name, prop.multiProcessorCount, prop.l2CacheSize >> 20,
              sms != prop.multiProcessorCount ? (", our kernels on " + std::to_string(sms)).c_str() : "");

  // Copy bandwidth (read + write counted) and dense fp16 GEMM rate, both in this run.
  double copy_bw = 0, gemm_flops = 0;
  {
    const size_t bytes = size_t(1) << 30;
    void *x, *y;
    CK(cudaMalloc(&x, bytes));
    CK(cudaMalloc(&y, bytes));
    CK(cudaMemset(x, 1, bytes));
    const auto copy_kernel = [&] {
      copy_int4<<<prop.multiProcessorCount * 8, 256, 0, st>>>(static_cast<const int4*>(x), static_cast<int4*>(y),
                                                            bytes / 16);
    };
    const Stats s = time_graph(st, [&](int) { CK(cudaMemcpyAsync(y, x, bytes, cudaMemcpyDeviceToDevice, st)); });
    const Stats k = time_graph(st, [&](int) { copy_kernel(); });
    copy_bw = 2.0 * bytes / (std::min(s.us, k.us) * 1e-6);
    const int N = 8192;
    __half *a, *b, *c;
    CK(cudaMalloc(&a, size_t(N) * N * 2));
    CK(cudaMalloc(&b, size_t(N) * N * 2));
    CK(cudaMalloc(&c, size_t(N) * N * 2));
    fill_half<<<1024, 256, 0, st>>>(a, size_t(N) * N, 1, -1.f, 1.f);
    fill_half<<<1024, 256, 0, st>>>(b, size_t(N) * N, 2, -1.f, 1.f);
    const float one = 1.f, zero = 0.f;
    const Stats g = time_graph(st, [&](int) {
      CB(cublasGemmEx(cub, CUBLAS_OP_N, CUBLAS_OP_N, N, N, N, &one, a, CUDA_R_16F, N, b, CUDA_R_16F, N, &zero, c,
                      CUDA_R_16F, N, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
    });
    gemm_flops = 2.0 * N * double(N) * N / (g.us * 1e-6);
    CK(cudaFree(a));
    CK(cudaFree(b));
    CK(cudaFree(c));
    // The dense GEMMs above (about a second of them) run the GPU into its power cap, and the clocks lag
    // behind: the first layer timed after them read up to 24% slow (8B q/k/v at m = 1: 8.7-10.0 us against
    // 8.0-8.3 at m = 4 and 8, cuBLAS 5% slow; docs/PERF.md, twenty-second session). Memory-bound copies,
    // untimed, for kSettleSeconds let them recover before the first timed graph, as every later layer finds them.
    const auto t_end = std::chrono::steady_clock::now() + std::chrono::duration<double>(kSettleSeconds);
    while (std::chrono::steady_clock::now() < t_end) {
      for (int r = 0; r < 8; ++r) copy_kernel();
      CK(cudaStreamSynchronize(st));
    }
    CK(cudaFree(x));
    CK(cudaFree(y));
  }
  std::printf("copy bandwidth (read+write): %.0f GB/s; cuBLAS fp16 8192^3: %.0f TFLOP/s\n", copy_bw / 1e9, gemm_flops / 1e12);

  std::vector<LayerSet> all_sets = {
      {"llama3-8b", 128, {{4096, 6144}, {4096, 4096}, {4096, 28672}, {14336, 4096}}},
      {"llama3-70b", 128, {{8192, 10240}, {8192, 8192}, {8192, 57344}, {28672, 8192}}},
      {"large", 128, {{32768, 32768}}},
      {"large", -1, {{32768, 32768}}},
      // Other models' layers (not in the issue's table), to check that Auto's per-shape rules, measured on the
      // Llama-3 layers, hold on other widths: q/k/v fused, o, gate/up fused, down, from each model's config.json.
      {"llama3.2-1b", 128, {{2048, 3072}, {2048, 2048}, {2048, 16384}, {8192, 2048}}},
      {"llama3.2-3b", 128, {{3072, 5120}, {3072, 3072}, {3072, 16384}, {8192, 3072}}},
      {"qwen2.5-7b", 128, {{3584, 4608}, {3584, 3584}, {3584, 37888}, {18944, 3584}}},
      {"qwen2.5-32b", 128, {{5120, 7168}, {5120, 5120}, {5120, 55296}, {27648, 5120}}},
      // Small models: no layer of 2^22 weights or more but gate/up and down, and Qwen2.5-0.5B's q/k/v, o and down
      // and Gemma-3-1B's o and down are not a whole number of 256-column slices (n = 1152, 896), so the Hopper kernel
      // runs them above m = 64 only, on its tiles 128 columns wide.
      {"qwen2.5-1.5b", 128, {{1536, 2048}, {1536, 1536}, {1536, 17920}, {8960, 1536}}},
      {"qwen2.5-0.5b", 128, {{896, 1152}, {896, 896}, {896, 9728}, {4864, 896}}},
      {"gemma3-1b", 128, {{1152, 1536}, {1024, 1152}, {1152, 13824}, {6912, 1152}}},
  };
  // One-layer sets named "KxN" (group 128) or "KxNgG" (G = -1, 32, 64 or 128), for profiling one shape.
  for (const std::string& w : sets_wanted) {
    int k = 0, n = 0, g = 128;
    if (std::sscanf(w.c_str(), "%dx%dg%d", &k, &n, &g) >= 2 && k > 0 && n > 0)
      all_sets.push_back({w.c_str(), g, {{k, n}}});
  }

  const size_t ws_bytes = marlin_workspace_bytes(sms, true);
  void* ws;
  CK(cudaMalloc(&ws, ws_bytes));
  CK(cudaMemset(ws, 0, ws_bytes));

  if (host_us) host_cost(st, ws, ws_bytes, sms);

  std::vector<Row> rows;
  std::string explore_log, timeline_log, floor_log;
  uint32_t* floor_sink = nullptr;  // the read kernel's never-taken store (one word per block)
  if (floor) CK(cudaMalloc(&floor_sink, size_t(prop.multiProcessorCount) * 8 * sizeof(uint32_t)));
  unsigned long long* tl_buf = nullptr;
  if (timeline && !marlin_timeline(nullptr, 0)) {
    std::printf("--timeline: this build does not record timelines (configure with -DMARLINC_TIMELINE=ON)\n");
    timeline = false;
  }
  if (timeline) CK(cudaMalloc(&tl_buf, size_t(kCalls) * kTlSlotWords * 8));
  for (const LayerSet& set : all_sets) {
    if (std::find(sets_wanted.begin(), sets_wanted.end(), set.name) == sets_wanted.end()) continue;
    std::vector<Row> set_rows;
    for (int m : ms) set_rows.push_back(Row{set.name, set.group, m});
    for (const Layer& L : set.layers) {
      const int G = set.group == -1 ? 1 : L.k / set.group;
      const size_t qbytes = size_t(L.k) * L.n / 2, sbytes = size_t(G) * L.n * 2, fbytes = size_t(L.k) * L.n * 2;
      const int nq = int(std::max<size_t>(1, (kRotateBytes + qbytes + sbytes - 1) / (qbytes + sbytes)));
      const int nf = int(std::max<size_t>(1, (kRotateBytes + fbytes - 1) / fbytes));
      std::vector<int32_t*> Bq(nq);
      std::vector<__half*> Sq(nq), Wf(nf);
      for (int i = 0; i < nq; ++i) {
        CK(cudaMalloc(&Bq[i], qbytes));
        CK(cudaMalloc(&Sq[i], sbytes));
        fill_bits<<<2048, 256, 0, st>>>(reinterpret_cast<uint32_t*>(Bq[i]), qbytes / 4, 100 + i);
        // Scales near 1/sqrt(k) keep outputs O(1) for N(0,1)-like activations.
        const float sc = 1.f / std::sqrt(float(L.k));
        fill_half<<<256, 256, 0, st>>>(Sq[i], sbytes / 2, 200 + i, 0.5f * sc, 1.5f * sc);
      }
      for (int i = 0; i < nf; ++i) {
        CK(cudaMalloc(&Wf[i], fbytes));
        fill_half<<<2048, 256, 0, st>>>(Wf[i], fbytes / 2, 300 + i, -0.05f, 0.05f);
      }
      __half *A, *C;
      CK(cudaMalloc(&A, size_t(max_m) * L.k * 2));
      CK(cudaMalloc(&C, size_t(max_m) * L.n * 2));
      fill_half<<<1024, 256, 0, st>>>(A, size_t(max_m) * L.k, 7, -1.f, 1.f);
      CK(cudaStreamSynchronize(st));

      if (floor) {
        // Each configuration over the rotating packed weights + scales, then over cuBLAS's fp16 weights.
        constexpr int nc = marlinc::bench::kReadFloorConfigCount;
        double rq[nc], rf[nc];
        for (int c = 0; c < nc; ++c) {
          const marlinc::bench::ReadFloorConfig& fc = marlinc::bench::kReadFloorConfigs[c];
          rq[c] = time_graph(st, [&](int i) {
                    CK(marlinc::bench::read_floor_launch(fc, sms, {reinterpret_cast<const int4*>(Bq[i % nq]), qbytes / 16},
                                                         {reinterpret_cast<const int4*>(Sq[i % nq]), sbytes / 16},
                                                         floor_sink, st, floor_tail_ns));
                  }).us;
          rf[c] = time_graph(st, [&](int i) {
                    CK(marlinc::bench::read_floor_launch(fc, sms, {reinterpret_cast<const int4*>(Wf[i % nf]), fbytes / 16},
                                                         {nullptr, 0}, floor_sink, st, floor_tail_ns));
                  }).us;
        }
        std::string line = "floor " + std::string(set.name) + " g" + std::to_string(set.group) + " k" +
                           std::to_string(L.k) + " n" + std::to_string(L.n) + (floor_tail_ns ? " tail " + std::to_string(floor_tail_ns) + " ns" : "");
        char num[96];
        for (int part = 0; part < 2; ++part) {
          std::snprintf(num, sizeof num, "%s%.1f MB in", part ? " | fp16 " : ": packed ",
                        double(part ? fbytes : qbytes + sbytes) / 1e6);
          line += num;
          for (int c = 0; c < nc; ++c) {
            std::snprintf(num, sizeof num, " %.2f (%s)", part ? rf[c] : rq[c], marlinc::bench::kReadFloorConfigs[c].name);
            line += num;
          }
          line += " us";
        }
        floor_log += line + "\n";
        double best_q = 1e30, best_f = 1e30, free_q = 0;
        for (int c = 0; c < nc; ++c) {
          const marlinc::bench::ReadFloorConfig& fc = marlinc::bench::kReadFloorConfigs[c];
          if (fc.ours) best_q = std::min(best_q, rq[c]), best_f = std::min(best_f, rf[c]);
          if (std::string(fc.name) == "free") free_q = rq[c];
        }
        for (Row& R : set_rows) R.read += best_q, R.read_free += free_q, R.read16 += best_f;
      }

      for (size_t mi = 0; mi < ms.size(); ++mi) {
        const int m = ms[mi];
        Row& R = set_rows[mi];
        const float one = 1.f, zero = 0.f;
        const std::string soak_id = std::string(set.name) + " g" + std::to_string(set.group) + " k" +
                                    std::to_string(L.k) + " n" + std::to_string(L.n) + " m" + std::to_string(m);
        const Stats sc = time_graph(
            st,
            [&](int i) {
              CB(cublasGemmEx(cub, CUBLAS_OP_N, CUBLAS_OP_N, L.n, m, L.k, &one, Wf[i % nf], CUDA_R_16F, L.n, A,
                              CUDA_R_16F, L.k, &zero, C, CUDA_R_16F, L.n, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
            },
            "cublas " + soak_id);
        auto marlin_call = [&](MarlinPath path, int tk, int tn, bool overlap = true, int mb = 0, int wr = 0) {
          return [&, path, tk, tn, overlap, mb, wr](int i) {
            MarlinGemm g;
            g.A = A; g.B = Bq[i % nq]; g.s = Sq[i % nq]; g.C = C;
            g.m = m; g.n = L.n; g.k = L.k; g.group_size = set.group;
            g.workspace = ws; g.workspace_bytes = ws_bytes; g.stream = st; g.cublas = cub; g.num_sms = sms;
            g.path = path; g.thread_k = tk; g.thread_n = tn; g.overlap_previous = overlap;
            g.wgmma_split = wgmma_split;
            g.mma_parts = mma_parts;
            g.thread_m_blocks = mb;
            g.wgmma_rows = wr;
            g.wgmma_pipeline = wr >= 32 || (wr == 0 && m > 16) ? wgmma_pipeline : 0;  // 2 needs 32-row tiles
            const MarlinStatus s = marlin_gemm(g);
            if (s != MarlinStatus::Ok) {
              std::fprintf(stderr, "marlin_gemm(m=%d k=%d n=%d): %s\n", m, L.k, L.n, marlin_status_name(s));
              std::exit(1);
            }
          };
        };
        const MarlinPath ap = marlin_auto_path(m, L.n, L.k);
        // --auto-only: only the kernel Auto picks (and cuBLAS); the other columns read 0.
        const bool all = !auto_only;
        // Only the kernel Auto takes soaks (--soak): the label of a path's graph.
        auto soak_if = [&](MarlinPath p) { return p == ap ? "auto " + soak_id : std::string(); };
        const Stats sf = all || ap == MarlinPath::Marlin
                             ? time_graph(st, marlin_call(MarlinPath::Marlin, 0, 0), soak_if(MarlinPath::Marlin))
                             : Stats{};
        const Stats ss = all ? time_graph(st, marlin_call(MarlinPath::Marlin, 0, 0, false)) : Stats{};
        double dq = 0, wg = 0;
        if (m >= 64 && (all || ap == MarlinPath::DequantCublas))
          dq = time_graph(st, marlin_call(MarlinPath::DequantCublas, 0, 0), soak_if(MarlinPath::DequantCublas)).us;
        const bool wg_runs = marlin_wgmma_available() && (L.n % 256 == 0 || (L.n % 128 == 0 && m > 64));
        // Where Auto takes the Hopper kernel, the auto column times Auto itself (its own launches: two where m is
        // just past whole row chunks, marlin_dispatch.h auto_split_head), unless --wgmma-rows / --wgmma-n force
        // tiles, which only path Wgmma honours; the wgmma column times path Wgmma (--wgmma, or forced tiles).
        const bool wg_forced = wgmma_rows != 0 || wgmma_n != 0;
        if (time_wgmma || (ap == MarlinPath::Wgmma && wg_forced))
          wg = wg_runs ? time_graph(st, marlin_call(MarlinPath::Wgmma, 0, wgmma_n, true, 0, wgmma_rows),
                                    soak_if(MarlinPath::Wgmma)).us
                       : sf.us;
        const double aw = ap == MarlinPath::Wgmma && !wg_forced
                              ? time_graph(st, marlin_call(MarlinPath::Auto, 0, 0), soak_if(MarlinPath::Wgmma)).us
                              : wg;
        const bool auto_cublas = ap == MarlinPath::DequantCublas, auto_wg = ap == MarlinPath::Wgmma;
        const bool auto_st = ap == MarlinPath::Stream;
        const double stv =
            auto_st ? time_graph(st, marlin_call(MarlinPath::Stream, 0, 0), soak_if(MarlinPath::Stream)).us : 0.0;
        const double au = auto_cublas ? dq : auto_wg ? aw : auto_st ? stv : sf.us;
        R.cublas += sc.us;
        R.fused += sf.us;
        R.serial += ss.us;
        R.dq += dq;
        R.wg += wg;
        R.autop += au;
        R.spread = std::max({R.spread, sc.spread, sf.spread});
        R.bytes += double(qbytes) + double(sbytes) + 2.0 * m * L.k + 2.0 * m * L.n;
        R.flops += 2.0 * m * double(L.k) * L.n;
        const MarlinTileChoice tc = marlin_choose_tiles(m, L.n, L.k, sms);
        char cfg[64];
        std::snprintf(cfg, sizeof cfg, "%s%dx%d%s", R.configs.empty() ? "" : " ", tc.thread_k, tc.thread_n,
                      tc.whole_k ? "k" : "");
        const char* sep = R.configs.empty() ? "" : " ";
        R.configs += auto_cublas ? std::string(sep) + "dq"
                     : auto_wg   ? std::string(sep) + "wg"
                     : auto_st   ? std::string(sep) + "st"
                                 : std::string(cfg);
        char lj[160];
        std::snprintf(lj, sizeof lj, "%s[%d, %d, %.2f, %.2f, %.2f, %.2f, %.2f, %.2f]", R.layers_json.empty() ? "" : ", ",
                      L.k, L.n, sc.us, sf.us, ss.us, dq, wg, au);
        R.layers_json += lj;
        if (timeline && !auto_cublas) {
          const MarlinPath tp = auto_wg ? MarlinPath::Wgmma : auto_st ? MarlinPath::Stream : MarlinPath::Marlin;
          timeline_log += timeline_line(st, tl_buf, marlin_call(tp, 0, auto_wg ? wgmma_n : 0, true, 0, auto_wg ? wgmma_rows : 0), set.name,
                                        set.group, m, L.k, L.n, au, auto_wg ? "wg" : auto_st ? "st" : "mma",
                                        timeline_dump);
        }
        if (explore && m <= 128) {
          const int tiles[3][2] = {{128, 128}, {64, 256}, {128, 64}};
          char line[256];
          std::snprintf(line, sizeof line, "explore %s g%d k%d n%d m%d: auto(%dx%d) %.1f", set.name, set.group, L.k, L.n,
                        m, tc.thread_k, tc.thread_n, sf.us);
          explore_log += line;
          // Every tile shape at the default m tile, and at 32-row m tiles (two row chunks side by side,
          // two blocks per SM) where the default tile is taller.
          for (int mbx : {0, 2}) {
            if (mbx == 2 && tc.thread_m_blocks <= 2) continue;
            for (auto& t : tiles) {
              if (L.n % t[1] != 0 || L.k % t[0] != 0) continue;
              const Stats sx = time_graph(st, marlin_call(MarlinPath::Marlin, t[0], t[1], true, mbx));
              std::snprintf(line, sizeof line, " | %dx%d%s %.1f", t[0], t[1], mbx ? "/mb2" : "", sx.us);
              explore_log += line;
            }
          }
          // The streaming kernel at each slice width its plan accepts (the width Auto's plan picks is one).
          if (marlin_wgmma_available() && m <= kStreamMaxM)
            for (int tn : kStreamTn) {
              const StreamPlan pl = stream_plan(L.n, L.k, sms, tn);
              if (pl.tn != tn) continue;
              const Stats sx = time_graph(st, marlin_call(MarlinPath::Stream, 0, tn));
              std::snprintf(line, sizeof line, " | st%d(split %d rounds %d) %.1f", tn, pl.split, pl.rounds, sx.us);
              explore_log += line;
            }
          explore_log += "\n";
        }
      }
      for (auto* p : Bq) CK(cudaFree(p));
      for (auto* p : Sq) CK(cudaFree(p));
      for (auto* p : Wf) CK(cudaFree(p));
      CK(cudaFree(A));
      CK(cudaFree(C));
    }
    rows.insert(rows.end(), set_rows.begin(), set_rows.end());
  }

  if (!explore_log.empty()) std::printf("%s", explore_log.c_str());
  if (!timeline_log.empty()) std::printf("%s", timeline_log.c_str());
  if (!floor_log.empty()) std::printf("%s", floor_log.c_str());
  if (floor_sink) CK(cudaFree(floor_sink));
  if (tl_buf) CK(cudaFree(tl_buf));
  if (!json_path.empty()) {
    FILE* f = std::fopen(json_path.c_str(), "w");
    if (f) {
      std::fprintf(f, "{\"device\": \"%s\", \"copy_bw_GBps\": %.1f, \"cublas_fp16_TFLOPs\": %.1f, \"rows\": [\n", prop.name,
                   copy_bw / 1e9, gemm_flops / 1e12);
      for (size_t i = 0; i < rows.size(); ++i) {
        const Row& r = rows[i];
        std::fprintf(f,
                     "  {\"set\": \"%s\", \"group\": %d, \"m\": %d, \"cublas_us\": %.2f, \"fused_us\": %.2f, \"fused_serial_us\": %.2f, "
                     "\"dequant_cublas_us\": %.2f, \"wgmma_us\": %.2f, \"auto_us\": %.2f, \"bytes\": %.0f, \"flops\": %.0f, \"spread\": %.3f, "
                     "\"read_us\": %.2f, \"read_free_us\": %.2f, \"fp16_read_us\": %.2f, "
                     "\"configs\": \"%s\", \"layers\": [%s]}%s\n",
                     r.set.c_str(), r.group, r.m, r.cublas, r.fused, r.serial, r.dq, r.wg, r.autop, r.bytes, r.flops, r.spread,
                     r.read, r.read_free, r.read16,
                     r.configs.c_str(), r.layers_json.c_str(), i + 1 < rows.size() ? "," : "");
      }
      std::fprintf(f, "]}\n");
      std::fclose(f);
    }
  }
  // serial: fused kernel launched plainly; fused/auto: with overlap_previous (see Row).
  std::printf("\n%-11s %3s %4s | %8s %8s %8s %8s %8s %8s | %5s %5s %5s | %5s %5s %5s | %5s | %s\n", "set", "g", "m",
              "cuBLAS", "serial", "fused", "dq+cuB", "wgmma", "auto", "x_ser", "x_fus", "x_aut", "GB/s", "%copy", "ideal",
              "sprd", "tiles (k x n)");
  for (const Row& r : rows) {
    const double t_ideal = std::max(r.bytes / copy_bw, r.flops / gemm_flops) * 1e6;
    std::printf("%-11s %3d %4d | %8.1f %8.1f %8.1f %8.1f %8.1f %8.1f | %5.2f %5.2f %5.2f | %5.0f %5.2f %5.2f | %5.3f | %s\n",
                r.set.c_str(), r.group, r.m, r.cublas, r.serial, r.fused, r.dq, r.wg, r.autop,
                ratio(r.cublas, r.serial), ratio(r.cublas, r.fused), r.cublas / r.autop, r.bytes / (r.autop * 1e-6) / 1e9,
                r.bytes / (r.autop * 1e-6) / copy_bw, t_ideal / r.autop, r.spread, r.configs.c_str());
  }
  std::printf("times in µs per call, summed over the set's layers; ");
  std::printf("copy bandwidth %.0f GB/s, cuBLAS fp16 %.0f TFLOP/s (ideal = max(bytes/copy, flops/cuBLAS peak)); "
              "tiles: Auto's per layer, wg = Hopper kernel, st = streaming kernel, dq = dequantize + cuBLAS, "
              "k = whole-k stripes\n",
              copy_bw / 1e9, gemm_flops / 1e12);
  if (floor) {
    // The bound: cuBLAS's time over the read-only kernel's. What Auto pays beyond the read is the fixed cost
    // (launch and first tile are in both; skew, split reduction and the write of C are Auto's alone).
    std::printf("\n%-11s %3s %4s | %8s %8s %8s %8s | %6s %6s %6s | %8s\n", "set", "g", "m", "cuBLAS", "auto", "read",
                "read16", "bound", "x_aut", "of_bnd", "auto-rd");
    for (const Row& r : rows)
      if (r.read > 0 && r.m <= kStreamMaxM)  // above m = 16 the GEMM's arithmetic, not the read, sets the time
        std::printf("%-11s %3d %4d | %8.1f %8.1f %8.1f %8.1f | %6.2f %6.2f %6.2f | %8.1f\n", r.set.c_str(), r.group, r.m,
                    r.cublas, r.autop, r.read, r.read16, r.cublas / r.read, r.cublas / r.autop, r.read / r.autop,
                    r.autop - r.read);
    std::printf("read: a kernel that only reads the layers' packed weights and scales, the fastest at 1 or 2 blocks "
                "per SM, overlapped launch (bench/read_floor.cuh); read16: the same over the fp16 weights; bound = "
                "cuBLAS / read; of_bnd = x_aut / bound; auto-rd = µs Auto spends beyond the read\n");
  }
  CK(cudaFree(ws));
  CB(cublasDestroy(cub));
  CK(cudaStreamDestroy(st));
  return 0;
}
