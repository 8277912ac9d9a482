// Element type of activations, scales and outputs of the W4A16 GEMMs (the packed B bytes do not
// depend on it, formats.md §2.6). Shared by the CPU reference and the CUDA launchers.
#pragma once

namespace marlinc::kernels {
enum class ActType { F16 = 0, BF16 = 1 };
}  // namespace marlinc::kernels
