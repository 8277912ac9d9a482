// Private helpers of the format adapters: typed, shape-checked copies of a module's tensors out of the
// mapped checkpoint, and PackedTensor construction. Tensor bytes are copied (not viewed) because
// safetensors only guarantees 8-byte alignment of the buffer start (formats.md §9.11).
#pragma once
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "checkpoint/checkpoint.h"
#include "checkpoint/dtype.h"
#include "checkpoint/error.h"
#include "packer/adapters.h"
#include "packer/quantized_linear.h"

namespace marlinc::fmt {

std::string shape_str(const std::vector<int64_t>& shape);
std::string join(const std::vector<std::string>& parts, const std::string& sep);

// The tensor `name`, which must exist with dtype `dt` (any of `dts`) and rank `rank`; throws BadData
// naming the tensor, what was found and what the format needs.
const TensorInfo& need(const Checkpoint& ck, const std::string& name, DType dt, size_t rank, const std::string& fmt);
const TensorInfo& need_scales(const Checkpoint& ck, const std::string& name, size_t rank, const std::string& fmt);

// Raw little-endian copy of a tensor's elements (element size must be sizeof(T)).
template <class T>
std::vector<T> copy_as(const Checkpoint& ck, const std::string& name) {
  std::span<const uint8_t> b = ck.data(name);
  std::vector<T> out(b.size() / sizeof(T));
  if (!b.empty()) std::memcpy(out.data(), b.data(), out.size() * sizeof(T));
  return out;
}

// Read-only typed access to a tensor's elements: a zero-copy view into the mapping when the bytes are
// aligned for T (the usual case), else an aligned copy. Not movable: data() may point into copy_.
template <class T>
class TensorData {
 public:
  TensorData(const Checkpoint& ck, const std::string& name) {
    std::span<const uint8_t> b = ck.data(name);
    n_ = b.size() / sizeof(T);
    if (reinterpret_cast<uintptr_t>(b.data()) % alignof(T) == 0) {
      ptr_ = reinterpret_cast<const T*>(b.data());
    } else {
      copy_.resize(n_);
      if (n_) std::memcpy(copy_.data(), b.data(), n_ * sizeof(T));
      ptr_ = copy_.data();
    }
  }
  TensorData(const TensorData&) = delete;
  TensorData& operator=(const TensorData&) = delete;
  const T* data() const { return ptr_; }
  size_t size() const { return n_; }

 private:
  std::vector<T> copy_;
  const T* ptr_ = nullptr;
  size_t n_ = 0;
};

ScaleType scale_type_of(DType dt);
DType dtype_of(ScaleType st);

// Transpose a row-major [rows, cols] matrix.
template <class T>
std::vector<T> transpose(const T* a, int64_t rows, int64_t cols) {
  std::vector<T> t(size_t(rows * cols));
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c) t[size_t(c * rows + r)] = a[size_t(r * cols + c)];
  return t;
}

template <class T>
PackedTensor make_tensor(std::string name, DType dt, std::vector<int64_t> shape, const std::vector<T>& v) {
  PackedTensor p{TensorSpec{std::move(name), dt, std::move(shape)}, {}};
  p.bytes.resize(v.size() * sizeof(T));
  if (!v.empty()) std::memcpy(p.bytes.data(), v.data(), p.bytes.size());
  return p;
}

// name + "." + suffix, or just suffix for the bare-file prefix "".
inline std::string tname(const std::string& prefix, const char* suffix) { return join_tensor_name(prefix, suffix); }

uint64_t tensor_bytes(const Checkpoint& ck, const std::vector<std::string>& names);

// Group size implied by G scale rows over k input rows: -1 for one row, else k / G (must divide).
int group_size_from_rows(int64_t k, int64_t groups, const std::string& what);

// A layer carrying module d's name, sizes, bits, group size and scale type, before its tensors are read.
QuantizedLinear layer_of(const ModuleDesc& d);

// The module's g_idx tensor g (I32, rank 1): k entries, each a group of d (gptq::validate_g_idx). Sets
// d.act_order when it is not the trivial row / group_size order, and lists the tensor in d.tensors.
void describe_g_idx(const Checkpoint& ck, const TensorInfo& g, ModuleDesc& d);

// Zero points [G, n] from a layer: real zeros, or 2^(bits-1) everywhere when symmetric.
std::vector<uint8_t> real_zeros(const QuantizedLinear& q);
// True when every entry is 2^(bits-1) (the layer is symmetric).
bool all_mid(const std::vector<uint8_t>& z, int bits);

}  // namespace marlinc::fmt

namespace marlinc {
// Per-format descriptions (one per adapter file); describe_module dispatches on the format.
ModuleDesc describe_gptq(const Checkpoint& ck, const std::string& prefix, const FormatInfo& fi);
ModuleDesc describe_marlin(const Checkpoint& ck, const std::string& prefix);
ModuleDesc describe_marlin24(const Checkpoint& ck, const std::string& prefix);
ModuleDesc describe_ct_marlin24(const Checkpoint& ck, const std::string& prefix);
ModuleDesc describe_awq(const Checkpoint& ck, const std::string& prefix, const FormatInfo& fi);
ModuleDesc describe_compressed_tensors(const Checkpoint& ck, const std::string& prefix, const FormatInfo& fi);
}  // namespace marlinc
