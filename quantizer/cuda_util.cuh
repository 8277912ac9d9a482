// What every CUDA translation unit of the quantizer needs: one check for runtime and cuBLAS
// statuses that names the statement, file, line and the layer or block it served (design.md: one
// CUDA_CHECK), and an owning device buffer so that a throw never leaks device memory.
#pragma once
#include <cublas_v2.h>
#include <cuda_runtime.h>
#include <cusolverDn.h>

#include <cstddef>
#include <cstdint>
#include <string>

#include "checkpoint/error.h"

namespace marlinc::cuda_util {

inline const char* status_text(cudaError_t e) { return cudaGetErrorString(e); }
inline const char* status_text(cublasStatus_t e) { return cublasGetStatusString(e); }
inline const char* status_text(cusolverStatus_t e) {
  switch (e) {
    case CUSOLVER_STATUS_NOT_INITIALIZED: return "CUSOLVER_STATUS_NOT_INITIALIZED";
    case CUSOLVER_STATUS_ALLOC_FAILED: return "CUSOLVER_STATUS_ALLOC_FAILED";
    case CUSOLVER_STATUS_INVALID_VALUE: return "CUSOLVER_STATUS_INVALID_VALUE";
    case CUSOLVER_STATUS_ARCH_MISMATCH: return "CUSOLVER_STATUS_ARCH_MISMATCH";
    case CUSOLVER_STATUS_EXECUTION_FAILED: return "CUSOLVER_STATUS_EXECUTION_FAILED";
    case CUSOLVER_STATUS_INTERNAL_ERROR: return "CUSOLVER_STATUS_INTERNAL_ERROR";
    case CUSOLVER_STATUS_NOT_SUPPORTED: return "CUSOLVER_STATUS_NOT_SUPPORTED";
    default: return "cuSOLVER error";
  }
}
inline bool ok(cudaError_t e) { return e == cudaSuccess; }
inline bool ok(cublasStatus_t e) { return e == CUBLAS_STATUS_SUCCESS; }
inline bool ok(cusolverStatus_t e) { return e == CUSOLVER_STATUS_SUCCESS; }

template <class Status>
void check(Status s, const char* stmt, const char* file, int line, const std::string& who) {
  if (!ok(s))
    fail(ErrorKind::Internal, who + ": " + stmt + " failed at " + file + ":" + std::to_string(line) + ": " +
                                  status_text(s));
}

// Owning device buffer of `count` elements, from cudaMalloc: for long-lived buffers (cudaFree waits
// for the whole device). Per-call scratch that must not stall other streams uses StreamBuf.
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

// Owning device buffer allocated and freed in stream order (cudaMallocAsync / cudaFreeAsync), so that
// work on other streams keeps running while it comes and goes (several GPTQ layers at once).
template <class T>
struct StreamBuf {
  T* p = nullptr;
  size_t count = 0;
  cudaStream_t stream = nullptr;
  StreamBuf() = default;
  StreamBuf(size_t c, cudaStream_t s, const std::string& who) { alloc(c, s, who); }
  StreamBuf(const StreamBuf&) = delete;
  StreamBuf& operator=(const StreamBuf&) = delete;
  ~StreamBuf() { reset(); }
  void alloc(size_t c, cudaStream_t s, const std::string& who) {
    reset();
    if (c == 0) return;
    void* q = nullptr;
    check(cudaMallocAsync(&q, c * sizeof(T), s), "cudaMallocAsync", __FILE__, __LINE__,
          who + " (" + std::to_string(c * sizeof(T)) + " bytes)");
    p = static_cast<T*>(q);
    count = c;
    stream = s;
  }
  void reset() {
    if (p) cudaFreeAsync(p, stream);
    p = nullptr;
    count = 0;
  }
};

// Keeps the device's default memory pool from handing memory back to the driver at every
// synchronisation (its default), which would make stream-ordered allocation as slow as cudaMalloc.
// Process-local: the device itself is not configured.
inline void keep_pool_memory(int device, const std::string& who) {
  cudaMemPool_t pool = nullptr;
  check(cudaDeviceGetDefaultMemPool(&pool, device), "cudaDeviceGetDefaultMemPool", __FILE__, __LINE__, who);
  uint64_t keep = UINT64_MAX;
  check(cudaMemPoolSetAttribute(pool, cudaMemPoolAttrReleaseThreshold, &keep), "cudaMemPoolSetAttribute", __FILE__,
        __LINE__, who);
}

}  // namespace marlinc::cuda_util
