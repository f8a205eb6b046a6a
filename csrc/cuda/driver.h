// The CUDA driver API, opened with dlopen at first use, never linked: the
// module imports where there is no GPU driver (and serves CPU tensors
// there), and builds with no CUDA header at all. Everything the CUDA side
// does to a device goes through here: its figures, its primary context, the
// kernels' module, launches, and whether a stream is capturing a graph.
// Plain C++; every failure throws std::runtime_error naming the call.
#pragma once

#include <cstddef>

namespace flashmla_perm {
namespace cuda {

// cuda.h's handles and values, declared here rather than included
// (tests/test_kernels.py holds the values against cuda.h where one is
// installed).
using CUresult = int;
using CUdevice = int;
using CUcontext = struct CUctx_st*;
using CUmodule = struct CUmod_st*;
using CUfunction = struct CUfunc_st*;
using CUstream = struct CUstream_st*;  // cudaStream_t is the same type

enum DeviceAttribute : int {
  kMultiprocessorCount = 16,            // CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT
  kMaxThreadsPerMultiprocessor = 39,    // CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_MULTIPROCESSOR
  kComputeCapabilityMajor = 75,         // CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR
  kComputeCapabilityMinor = 76,         // CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR
  kMaxSharedMemoryPerMultiprocessor = 81,  // CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_MULTIPROCESSOR
  kMaxRegistersPerMultiprocessor = 82,  // CU_DEVICE_ATTRIBUTE_MAX_REGISTERS_PER_MULTIPROCESSOR
  kMaxBlocksPerMultiprocessor = 106,    // CU_DEVICE_ATTRIBUTE_MAX_BLOCKS_PER_MULTIPROCESSOR
  kReservedSharedMemoryPerBlock = 111,  // CU_DEVICE_ATTRIBUTE_RESERVED_SHARED_MEMORY_PER_BLOCK
};
enum FunctionAttribute : int {
  kNumRegs = 4,                         // CU_FUNC_ATTRIBUTE_NUM_REGS
  kMaxDynamicSharedSizeBytes = 8,       // CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES
  kPreferredSharedMemoryCarveout = 9,   // CU_FUNC_ATTRIBUTE_PREFERRED_SHARED_MEMORY_CARVEOUT
};
constexpr int kCarveoutMaxShared = 100;      // CU_SHAREDMEM_CARVEOUT_MAX_SHARED
// cuLaunchKernel's `extra` keys, as integers: a parameter block and its size.
constexpr int kLaunchParamEnd = 0;            // CU_LAUNCH_PARAM_END_AS_INT
constexpr int kLaunchParamBufferPointer = 1;  // CU_LAUNCH_PARAM_BUFFER_POINTER_AS_INT
constexpr int kLaunchParamBufferSize = 2;     // CU_LAUNCH_PARAM_BUFFER_SIZE_AS_INT
constexpr int kCaptureStatusNone = 0;        // CU_STREAM_CAPTURE_STATUS_NONE
constexpr int kCaptureModeRelaxed = 2;       // CU_STREAM_CAPTURE_MODE_RELAXED
// Errors that say a module's image is not one this driver and GPU run
// (CU_ERROR_INVALID_IMAGE, _NO_BINARY_FOR_GPU, _INVALID_PTX, _UNSUPPORTED_PTX_VERSION).
constexpr int kImageErrors[] = {200, 209, 218, 222};
// The legacy default stream asked while another (blocking) stream captures
// (CUDA_ERROR_STREAM_CAPTURE_IMPLICIT).
constexpr int kErrorCaptureImplicit = 906;

struct Driver {
  CUresult (*Init)(unsigned);
  CUresult (*DeviceGet)(CUdevice*, int);
  CUresult (*DeviceGetAttribute)(int*, int, CUdevice);
  CUresult (*DevicePrimaryCtxRetain)(CUcontext*, CUdevice);
  CUresult (*CtxGetCurrent)(CUcontext*);
  CUresult (*CtxSetCurrent)(CUcontext);
  CUresult (*ModuleLoadData)(CUmodule*, const void*);
  CUresult (*ModuleGetFunction)(CUfunction*, CUmodule, const char*);
  CUresult (*ModuleUnload)(CUmodule);
  CUresult (*FuncGetAttribute)(int*, int, CUfunction);
  CUresult (*FuncSetAttribute)(CUfunction, int, int);
  // (index, offset, size) of a kernel's parameter; null where the driver
  // predates it (CUDA 12.4).
  CUresult (*FuncGetParamInfo)(CUfunction, size_t, size_t*, size_t*);
  CUresult (*OccupancyMaxActiveBlocksPerMultiprocessor)(int*, CUfunction, int, size_t);
  CUresult (*LaunchKernel)(CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned,
                           CUstream, void**, void**);
  CUresult (*StreamIsCapturing)(CUstream, int*);
  CUresult (*ThreadExchangeStreamCaptureMode)(int*);
  CUresult (*GetErrorString)(CUresult, const char**);
};

// The driver library (libcuda.so.1, which torch has loaded wherever a GPU is
// in use), initialised once.
const Driver& driver();
// Whether the driver opened is the tests' stand-in (tests/stub_cuda), which
// runs no kernel and so takes launches on fake addresses.
bool stand_in();
// Throws, naming `call` and the driver's words for `r`, unless r is success.
void check(CUresult r, const char* call);

// `device`'s primary context (the one torch's CUDA runtime uses) current on
// this thread while it lives, and the one before it (or none) after: every
// driver call below needs one (a thread that has run no CUDA runtime call
// yet has none), and the runtime takes its current device from the current
// context, so a change left behind would move the caller's later work.
class ContextGuard {
 public:
  explicit ContextGuard(int device);
  ~ContextGuard();
  ContextGuard(const ContextGuard&) = delete;
  ContextGuard& operator=(const ContextGuard&) = delete;

 private:
  CUcontext previous_ = nullptr;
  bool changed_ = false;
};
int device_attribute(int device, DeviceAttribute attribute);
// Whether `stream` is capturing a CUDA graph.
bool capturing(CUstream stream);

// This thread's capture mode relaxed while it lives: work that is not a
// stream operation (loading a module) would otherwise invalidate a capture
// another thread runs in the global mode.
class RelaxedCapture {
 public:
  RelaxedCapture();
  ~RelaxedCapture();
  RelaxedCapture(const RelaxedCapture&) = delete;
  RelaxedCapture& operator=(const RelaxedCapture&) = delete;

 private:
  int previous_ = kCaptureModeRelaxed;
};

}  // namespace cuda
}  // namespace flashmla_perm
