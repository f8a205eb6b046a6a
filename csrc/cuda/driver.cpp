#include "cuda/driver.h"

#include <dlfcn.h>

#include <mutex>
#include <stdexcept>
#include <string>
#include <vector>

namespace flashmla_perm {
namespace cuda {
namespace {

[[noreturn]] void fail(const std::string& what) { throw std::runtime_error("flashmla_perm: " + what); }

template <class F>
void bind(void* lib, const char* name, F& f) {
  f = reinterpret_cast<F>(dlsym(lib, name));
  if (!f) fail(std::string("the CUDA driver library libcuda.so.1 has no ") + name);
}

void* library = nullptr;

}  // namespace

const Driver& driver() {
  static std::once_flag once;
  static Driver d;
  std::call_once(once, [] {
    // The system's driver, as torch's CUDA runtime found it: already loaded
    // wherever a GPU tensor exists.
    void* lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL | RTLD_NOLOAD);
    if (!lib) lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    if (!lib) fail(std::string("cannot open the CUDA driver library libcuda.so.1: ") + dlerror());
    library = lib;
    bind(lib, "cuInit", d.Init);
    bind(lib, "cuDeviceGet", d.DeviceGet);
    bind(lib, "cuDeviceGetAttribute", d.DeviceGetAttribute);
    bind(lib, "cuDevicePrimaryCtxRetain", d.DevicePrimaryCtxRetain);
    bind(lib, "cuCtxGetCurrent", d.CtxGetCurrent);
    bind(lib, "cuCtxSetCurrent", d.CtxSetCurrent);
    bind(lib, "cuModuleLoadData", d.ModuleLoadData);
    bind(lib, "cuModuleGetFunction", d.ModuleGetFunction);
    bind(lib, "cuModuleUnload", d.ModuleUnload);
    bind(lib, "cuFuncGetAttribute", d.FuncGetAttribute);
    bind(lib, "cuFuncSetAttribute", d.FuncSetAttribute);
    d.FuncGetParamInfo = reinterpret_cast<decltype(d.FuncGetParamInfo)>(dlsym(lib, "cuFuncGetParamInfo"));
    bind(lib, "cuOccupancyMaxActiveBlocksPerMultiprocessor", d.OccupancyMaxActiveBlocksPerMultiprocessor);
    bind(lib, "cuLaunchKernel", d.LaunchKernel);
    bind(lib, "cuStreamIsCapturing", d.StreamIsCapturing);
    bind(lib, "cuThreadExchangeStreamCaptureMode", d.ThreadExchangeStreamCaptureMode);
    bind(lib, "cuGetErrorString", d.GetErrorString);
    const CUresult r = d.Init(0);
    if (r != 0) {
      const char* text = nullptr;
      d.GetErrorString(r, &text);
      fail(std::string("cuInit failed: ") + (text ? text : "error " + std::to_string(r)));
    }
  });
  return d;
}

bool stand_in() {
  driver();
  return dlsym(library, "flashmla_perm_stand_in") != nullptr;
}

void check(CUresult r, const char* call) {
  if (r == 0) return;
  const char* text = nullptr;
  driver().GetErrorString(r, &text);
  fail(std::string(call) + " failed: " + (text ? text : "error " + std::to_string(r)));
}

ContextGuard::ContextGuard(int device) {
  // Retained once per device and kept: the runtime holds it for the process.
  static std::mutex mu;
  static std::vector<CUcontext> primary;
  CUcontext want;
  {
    std::lock_guard<std::mutex> lock(mu);
    if (static_cast<int>(primary.size()) <= device) primary.resize(device + 1, nullptr);
    if (!primary[device]) {
      CUdevice dev;
      check(driver().DeviceGet(&dev, device), "cuDeviceGet");
      check(driver().DevicePrimaryCtxRetain(&primary[device], dev), "cuDevicePrimaryCtxRetain");
    }
    want = primary[device];
  }
  check(driver().CtxGetCurrent(&previous_), "cuCtxGetCurrent");
  if (previous_ != want) {
    check(driver().CtxSetCurrent(want), "cuCtxSetCurrent");
    changed_ = true;
  }
}

ContextGuard::~ContextGuard() {
  if (changed_) driver().CtxSetCurrent(previous_);  // no throw from a destructor
}

int device_attribute(int device, DeviceAttribute attribute) {
  CUdevice dev;
  check(driver().DeviceGet(&dev, device), "cuDeviceGet");
  int value = 0;
  check(driver().DeviceGetAttribute(&value, attribute, dev), "cuDeviceGetAttribute");
  return value;
}

bool capturing(CUstream stream) {
  int status = kCaptureStatusNone;
  const CUresult r = driver().StreamIsCapturing(stream, &status);
  if (r == kErrorCaptureImplicit) return true;  // as good as capturing: no blocking work now
  check(r, "cuStreamIsCapturing");
  return status != kCaptureStatusNone;
}

RelaxedCapture::RelaxedCapture() {
  int mode = kCaptureModeRelaxed;
  check(driver().ThreadExchangeStreamCaptureMode(&mode), "cuThreadExchangeStreamCaptureMode");
  previous_ = mode;
}

RelaxedCapture::~RelaxedCapture() {
  int mode = previous_;
  driver().ThreadExchangeStreamCaptureMode(&mode);  // no throw from a destructor
}

}  // namespace cuda
}  // namespace flashmla_perm
