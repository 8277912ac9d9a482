// What every CUDA translation unit of the quantizer needs: one check for runtime and cuBLAS
// statuses that names the statement, file, line and the layer or block it served (design.md: one
// CUDA_CHECK), and an owning device buffer so that a throw never leaks device memory.
#pragma once
#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <cstddef>
#include <string>

#include "checkpoint/error.h"

namespace marlinc::cuda_util {

inline const char* status_text(cudaError_t e) { return cudaGetErrorString(e); }
inline const char* status_text(cublasStatus_t e) { return cublasGetStatusString(e); }
inline bool ok(cudaError_t e) { return e == cudaSuccess; }
inline bool ok(cublasStatus_t e) { return e == CUBLAS_STATUS_SUCCESS; }

template <class Status>
void check(Status s, const char* stmt, const char* file, int line, const std::string& who) {
  if (!ok(s))
    fail(ErrorKind::Internal, who + ": " + stmt + " failed at " + file + ":" + std::to_string(line) + ": " +
                                  status_text(s));
}

// Owning device buffer of `count` elements.
template <class T>
struct DBuf {
  T* p = nullptr;
  size_t count = 0;
  DBuf() = default;
  DBuf(const DBuf&) = delete;
  DBuf& operator=(const DBuf&) = delete;
  ~DBuf() { reset(); }
  // Keeps the buffer when it is already large enough (scratch reused across calls).
  void reserve(size_t c, const std::string& who) {
    if (c <= count) return;
    reset();
    void* q = nullptr;
    check(cudaMalloc(&q, c * sizeof(T)), "cudaMalloc", __FILE__, __LINE__,
          who + " (" + std::to_string(c * sizeof(T)) + " bytes)");
    p = static_cast<T*>(q);
    count = c;
  }
  void reset() {
    if (p) cudaFree(p);
    p = nullptr;
    count = 0;
  }
};

}  // namespace marlinc::cuda_util
