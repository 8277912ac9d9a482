#include "quantizer/hessian.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>
#include <fstream>
#include <vector>

#include "checkpoint/error.h"
#include "checkpoint/half.h"

namespace marlinc {

namespace {

static_assert(std::endian::native == std::endian::little, "Hessian files are written in host order = little-endian");

// Columns of Σ per parallel panel: wide enough for an efficient GEMM, narrow enough that the
// triangle splits into many tasks for load balance.
constexpr int64_t kPanel = 128;
// Rows of converted fp16/bf16 activations per chunk (bounds the fp32 staging buffer).
constexpr int64_t kConvertRows = 256;

constexpr char kMagic[8] = {'M', 'L', 'C', 'H', 'E', 'S', 'S', '1'};
constexpr uint32_t kVersion = 1;
constexpr uint32_t kDtypeF32 = 0;

struct FileHeader {
  char magic[8];
  uint32_t version;
  uint32_t dtype;
  int64_t k;
  int64_t tokens;
  int64_t samples;
  uint64_t checksum;  // FNV-1a 64 over the payload bytes
};
static_assert(sizeof(FileHeader) == 48, "header is 48 bytes with no padding, the on-disk layout");

uint64_t fnv1a64(const void* data, size_t bytes) {
  const auto* p = static_cast<const unsigned char*>(data);
  uint64_t h = 0xcbf29ce484222325ull;
  for (size_t i = 0; i < bytes; ++i) h = (h ^ p[i]) * 0x100000001b3ull;
  return h;
}

using RowMapC = Eigen::Map<const Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>>;

}  // namespace

HessianAccumulator::HessianAccumulator(int64_t k) : k_(k) {
  if (k <= 0) bad_usage("Hessian accumulator: input width k=" + std::to_string(k) + " must be positive");
  sum_ = Eigen::MatrixXf::Zero(k, k);
}

void HessianAccumulator::add_rows(const float* X, int64_t t) {
  RowMapC Xm(X, t, k_);  // [t, k]
  const int64_t panels = (k_ + kPanel - 1) / kPanel;
  // Each panel of the lower triangle Σ[j0:, j0:j1] is owned by one thread and summed by one
  // single-threaded GEMM, so the result is the same for any thread count.
#pragma omp parallel for schedule(dynamic, 1)
  for (int64_t p = 0; p < panels; ++p) {
    const int64_t j0 = p * kPanel, w = std::min(kPanel, k_ - j0);
    sum_.block(j0, j0, k_ - j0, w).noalias() += Xm.rightCols(k_ - j0).transpose() * Xm.middleCols(j0, w);
  }
}

void HessianAccumulator::add(const float* X, int64_t t) {
  if (t < 0) bad_usage("Hessian accumulator: sample length " + std::to_string(t) + " must be >= 0");
  if (t == 0) { ++samples_; return; }
  int64_t bad = -1;
#pragma omp parallel for schedule(static) reduction(max : bad)
  for (int64_t i = 0; i < t * k_; ++i)
    if (!std::isfinite(X[i])) bad = std::max(bad, i);
  if (bad >= 0)
    bad_usage("Hessian accumulator: activation of sample " + std::to_string(samples_) + " at token " +
              std::to_string(bad / k_) + ", channel " + std::to_string(bad % k_) + " is not finite");
  add_rows(X, t);
  tokens_ += t;
  ++samples_;
}

void HessianAccumulator::add_f16(const uint16_t* X, int64_t t) {
  if (t < 0) bad_usage("Hessian accumulator: sample length " + std::to_string(t) + " must be >= 0");
  std::vector<float> buf(static_cast<size_t>(std::min(t, kConvertRows) * k_));  // [rows, k]
  const int64_t before = samples_;
  for (int64_t r0 = 0; r0 < t; r0 += kConvertRows) {
    const int64_t rows = std::min(kConvertRows, t - r0);
    half_to_float_n(X + r0 * k_, buf.data(), size_t(rows * k_));
    add(buf.data(), rows);
  }
  samples_ = before + 1;  // the chunks above are one sample
}

void HessianAccumulator::add_bf16(const uint16_t* X, int64_t t) {
  if (t < 0) bad_usage("Hessian accumulator: sample length " + std::to_string(t) + " must be >= 0");
  std::vector<float> buf(static_cast<size_t>(std::min(t, kConvertRows) * k_));  // [rows, k]
  const int64_t before = samples_;
  for (int64_t r0 = 0; r0 < t; r0 += kConvertRows) {
    const int64_t rows = std::min(kConvertRows, t - r0);
    bf16_to_float_n(X + r0 * k_, buf.data(), size_t(rows * k_));
    add(buf.data(), rows);
  }
  samples_ = before + 1;
}

Eigen::MatrixXf HessianAccumulator::sum() const {
  Eigen::MatrixXf s = sum_;
  s.triangularView<Eigen::StrictlyUpper>() = s.transpose();
  return s;
}

Eigen::MatrixXf HessianAccumulator::finalize() const {
  if (tokens_ == 0)
    bad_usage("Hessian accumulator (k=" + std::to_string(k_) + "): no calibration token was added, H is undefined");
  Eigen::MatrixXf h = sum();
  h *= float(2.0 / double(tokens_));
  return h;
}

void HessianAccumulator::save(const std::filesystem::path& path) const {
  const Eigen::MatrixXf s = sum();
  const size_t bytes = size_t(k_ * k_) * sizeof(float);
  FileHeader h{};
  std::memcpy(h.magic, kMagic, 8);
  h.version = kVersion;
  h.dtype = kDtypeF32;
  h.k = k_;
  h.tokens = tokens_;
  h.samples = samples_;
  h.checksum = fnv1a64(s.data(), bytes);
  // Write beside the target and rename, so a crash never leaves a half-written Hessian under the name.
  std::filesystem::path tmp = path;
  tmp += ".tmp";
  {
    std::ofstream f(tmp, std::ios::binary | std::ios::trunc);
    if (!f) fail(ErrorKind::Io, "cannot create Hessian file " + tmp.string());
    f.write(reinterpret_cast<const char*>(&h), sizeof h);
    f.write(reinterpret_cast<const char*>(s.data()), std::streamsize(bytes));
    f.flush();
    if (!f) fail(ErrorKind::Io, "write failed for Hessian file " + tmp.string());
  }
  std::error_code ec;
  std::filesystem::rename(tmp, path, ec);
  if (ec) fail(ErrorKind::Io, "cannot rename " + tmp.string() + " to " + path.string() + ": " + ec.message());
}

HessianAccumulator HessianAccumulator::load(const std::filesystem::path& path) {
  const std::string name = path.string();
  std::ifstream f(path, std::ios::binary);
  if (!f) fail(ErrorKind::Io, "cannot open Hessian file " + name);
  std::error_code ec;
  const uintmax_t size = std::filesystem::file_size(path, ec);
  if (ec) fail(ErrorKind::Io, "cannot stat Hessian file " + name + ": " + ec.message());
  FileHeader h{};
  if (size < sizeof h) bad_data("Hessian file " + name + ": " + std::to_string(size) + " bytes is shorter than the 48-byte header");
  f.read(reinterpret_cast<char*>(&h), sizeof h);
  if (!f) fail(ErrorKind::Io, "read failed for Hessian file " + name);
  if (std::memcmp(h.magic, kMagic, 8) != 0) bad_data("Hessian file " + name + ": bad magic (expected \"MLCHESS1\")");
  if (h.version != kVersion)
    bad_data("Hessian file " + name + ": version " + std::to_string(h.version) + " is not supported (expected 1)");
  if (h.dtype != kDtypeF32) bad_data("Hessian file " + name + ": dtype " + std::to_string(h.dtype) + " is not f32 (0)");
  if (h.k <= 0 || h.k > (int64_t(1) << 20))
    bad_data("Hessian file " + name + ": k=" + std::to_string(h.k) + " outside [1, 2^20]");
  if (h.tokens < 0 || h.samples < 0)
    bad_data("Hessian file " + name + ": negative token or sample count");
  const uintmax_t want = sizeof h + uintmax_t(h.k) * uintmax_t(h.k) * sizeof(float);
  if (size != want)
    bad_data("Hessian file " + name + ": size " + std::to_string(size) + " bytes, expected " + std::to_string(want) +
             " for k=" + std::to_string(h.k) + " (truncated or trailing bytes)");
  HessianAccumulator acc(h.k);
  f.read(reinterpret_cast<char*>(acc.sum_.data()), std::streamsize(h.k * h.k * int64_t(sizeof(float))));
  if (!f) fail(ErrorKind::Io, "read failed for Hessian file " + name);
  if (fnv1a64(acc.sum_.data(), size_t(h.k * h.k) * sizeof(float)) != h.checksum)
    bad_data("Hessian file " + name + ": payload checksum mismatch (file corrupted)");
  if (!acc.sum_.allFinite()) bad_data("Hessian file " + name + ": payload holds non-finite values");
  acc.tokens_ = h.tokens;
  acc.samples_ = h.samples;
  return acc;
}

Eigen::MatrixXd hessian_ref(const float* X, int64_t N, int64_t k) {
  Eigen::MatrixXd h = Eigen::MatrixXd::Zero(k, k);
  for (int64_t t = 0; t < N; ++t)
    for (int64_t i = 0; i < k; ++i)
      for (int64_t j = 0; j < k; ++j) h(i, j) += double(X[t * k + i]) * double(X[t * k + j]);
  return h * (2.0 / double(N));
}

}  // namespace marlinc
