// The CUDA kernels and their launch, apart from torch: cuda_kernels.cu
// includes this (launch.h and the CUDA runtime) and the standard library
// only, so nvcc parses no ATen header once per architecture; cuda_executor.cpp (the host
// compiler) queries the device, allocates scratch, picks the stream and
// checks every call these make.
#pragma once

#include <cuda_runtime_api.h>

#include "launch.h"

namespace flashmla_perm {

// Enqueues one planned launch on `stream`; the caller checks
// cudaGetLastError().
void launch_kernel(const Launch& l, cudaStream_t stream);

// Sets spec.regs (each kernel's registers per thread; kCols: the larger of
// its two forms), after asking each kernel for the largest shared-memory
// carveout: the plan counts on the whole shared memory per SM (wo_a: 6 CTAs
// of 33 KiB), not the driver's guess. The first failing call's error, else
// cudaSuccess.
cudaError_t query_kernel_registers(DeviceSpec& spec);

}  // namespace flashmla_perm
