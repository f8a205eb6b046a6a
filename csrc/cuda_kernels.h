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

// *ctas: the CTAs of `kernel` (kCols: the fewer of its two forms) that one SM
// of the current device holds at once with `threads` threads and
// `smem_bytes` of dynamic shared memory, by the runtime's occupancy
// calculator, which knows the carveout the driver grants (a preference is a
// hint). ctas_per_sm (launch.h) plans from the device's figures; the tests
// hold the two against each other on a GPU. Call after query_kernel_registers.
cudaError_t resident_ctas_per_sm(Kernel kernel, int threads, int64_t smem_bytes, int* ctas);

}  // namespace flashmla_perm
