// torch's current CUDA stream, through its C shim (torch/csrc/inductor/
// aoti_torch/c/shim.h, in libtorch_cuda of every torch this package
// supports): a stable C function, where c10::cuda's C++ API would need the
// CUDA runtime's headers. Declared here because shim.h declares it only
// under USE_CUDA. Returns 0 on success.
#pragma once

#include <cstdint>

extern "C" int32_t aoti_torch_get_current_cuda_stream(int32_t device_index, void** ret_stream);
