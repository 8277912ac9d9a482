// libFuzzer target for the safetensors header parser: any byte string, taken as a whole file, must
// either parse into a header whose tensors tile the buffer, or throw marlinc::Error(BadData). Any other
// exception, crash, leak or UB report is a bug.
#include <cstddef>
#include <cstdint>
#include <cstdlib>

#include "checkpoint/safetensors.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  try {
    auto h = marlinc::parse_safetensors_header(data, size, size, "fuzz");
    // Properties a successful parse guarantees; abort() makes a violation a finding.
    uint64_t pos = 0;
    for (const auto& t : h.tensors) {
      if (t.begin != pos || t.end < t.begin) std::abort();
      if (uint64_t(t.numel()) * marlinc::dtype_size(t.dtype) != t.nbytes()) std::abort();
      pos = t.end;
    }
    if (h.data_start + pos != size) std::abort();
  } catch (const marlinc::Error& e) {
    if (e.kind() != marlinc::ErrorKind::BadData) std::abort();
  }
  return 0;
}
