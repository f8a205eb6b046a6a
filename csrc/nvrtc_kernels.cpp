// The CUDA kernels through NVRTC (nvrtc_kernels.h says when and why).
// Built only with the CUDA kernels (FLASHMLA_PERM_WITH_CUDA), by the host
// compiler.
#ifdef FLASHMLA_PERM_WITH_CUDA

#include "nvrtc_kernels.h"

#include <cuda_runtime_api.h>
#include <dlfcn.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <map>
#include <memory>
#include <mutex>
#include <sstream>
#include <stdexcept>
#include <vector>

#include "nvrtc_sources.h"  // generated at build time (scripts/embed_kernel_sources.py)

namespace flashmla_perm {
namespace nvrtc {
namespace {

// The standard headers the kernels' source names and NVRTC lacks: what the
// device code uses of them, no more (uint4 and memcpy are NVRTC built-ins).
const char* const kShimNames[] = {"cstdint", "cstring", "type_traits"};
const char* const kShims[] = {
    "#pragma once\n"
    "typedef signed char int8_t; typedef short int16_t; typedef int int32_t; typedef long long int64_t;\n"
    "typedef unsigned char uint8_t; typedef unsigned short uint16_t; typedef unsigned int uint32_t;\n"
    "typedef unsigned long long uint64_t; typedef unsigned long long uintptr_t;\n"
    "namespace std { using ::int8_t; using ::int16_t; using ::int32_t; using ::int64_t; using ::uint8_t;\n"
    "using ::uint16_t; using ::uint32_t; using ::uint64_t; using ::uintptr_t; using ::size_t; }\n",
    "#pragma once\nnamespace std { using ::memcpy; using ::memset; }\n",
    "#pragma once\nnamespace std {\n"
    "template <class T, T v> struct integral_constant {\n"
    "  static constexpr T value = v; using value_type = T; using type = integral_constant;\n"
    "  constexpr operator T() const { return v; } };\n}\n"};

// NVRTC's options besides the architecture. Unannotated functions are
// device code (tile_bodies.h's inline helpers, and the lambdas, which nvcc
// takes as device code inside a kernel).
const char* const kOptions[] = {"-std=c++17", "-default-device", "-Xptxas=-v"};

// The kernels by the names cuda_kernels.cu gives them, in Kernel order with
// cols' staged form before its direct one (as cuda_kernels.cu's compiled_kernel).
const char* const kKernelExpressions[4] = {
    "&flashmla_perm::flashmla_perm_rows", "&flashmla_perm::flashmla_perm_save_heads",
    "&flashmla_perm::flashmla_perm_cols<true>", "&flashmla_perm::flashmla_perm_cols<false>"};

[[noreturn]] void fail(const std::string& what) { throw std::runtime_error("flashmla_perm: " + what); }

// ---- NVRTC, opened at first use ---------------------------------------------

using nvrtcProgram = void*;
struct Nvrtc {
  const char* (*GetErrorString)(int);
  int (*Version)(int*, int*);
  int (*CreateProgram)(nvrtcProgram*, const char*, const char*, int, const char* const*, const char* const*);
  int (*DestroyProgram)(nvrtcProgram*);
  int (*CompileProgram)(nvrtcProgram, int, const char* const*);
  int (*GetCUBINSize)(nvrtcProgram, size_t*);
  int (*GetCUBIN)(nvrtcProgram, char*);
  int (*GetProgramLogSize)(nvrtcProgram, size_t*);
  int (*GetProgramLog)(nvrtcProgram, char*);
  int (*AddNameExpression)(nvrtcProgram, const char*);
  int (*GetLoweredName)(nvrtcProgram, const char*, const char**);
  std::string path, version;
};

constexpr int kCudaMajor =
    CUDART_VERSION / 1000;  // torch's CUDA, whose runtime headers the module built with

std::string folder_of(const std::string& path) {
  const size_t slash = path.rfind('/');
  return slash == std::string::npos ? "." : path.substr(0, slash);
}

bool exists(const std::string& path) {
  struct stat st;
  return ::stat(path.c_str(), &st) == 0;
}

// Where NVRTC may be, in order: FLASHMLA_PERM_NVRTC_LIBRARY alone where set;
// else beside torch's CUDA runtime (the nvidia pip packages' lib folder:
// nvidia/cu13/lib holds both; CUDA 12's nvidia/cuda_nvrtc/lib is a sibling of
// nvidia/cuda_runtime/lib), the toolkit of CUDA_HOME, and the loader's own
// search (LD_LIBRARY_PATH, ldconfig).
std::vector<std::string> nvrtc_candidates() {
  if (const char* forced = std::getenv("FLASHMLA_PERM_NVRTC_LIBRARY"); forced && *forced) return {forced};
  const std::string name = "libnvrtc.so." + std::to_string(kCudaMajor);
  std::vector<std::string> out;
  Dl_info info;
  if (dladdr(reinterpret_cast<void*>(&cudaRuntimeGetVersion), &info) && info.dli_fname) {
    const std::string lib = folder_of(info.dli_fname);
    out.push_back(lib + "/" + name);
    out.push_back(folder_of(folder_of(lib)) + "/cuda_nvrtc/lib/" + name);
  }
  for (const char* var : {"CUDA_HOME", "CUDA_PATH"})
    if (const char* home = std::getenv(var); home && *home)
      out.push_back(std::string(home) + "/lib64/" + name);
  out.push_back(name);
  return out;
}

template <class F>
void bind(void* lib, const char* name, F& f, const std::string& path) {
  f = reinterpret_cast<F>(dlsym(lib, name));
  if (!f) fail(std::string("NVRTC at ") + path + " has no " + name);
}

const Nvrtc& nvrtc_library() {
  static std::mutex mu;
  static std::unique_ptr<Nvrtc> lib;
  std::lock_guard<std::mutex> lock(mu);
  if (lib) return *lib;
  std::string tried;
  void* handle = nullptr;
  std::string path;
  for (const std::string& c : nvrtc_candidates()) {
    if (c.find('/') != std::string::npos && !exists(c)) {
      tried += "\n  " + c + " (no such file)";
      continue;
    }
    handle = dlopen(c.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (handle) {
      path = c;
      break;
    }
    const char* why = dlerror();
    tried += "\n  " + c + " (" + (why ? why : "dlopen failed") + ")";
  }
  if (!handle)
    fail(
        "the CUDA kernels of this build are compiled at first use by NVRTC, and no NVRTC library was found;"
        " install it with `pip install nvidia-cuda-nvrtc" +
        std::string(kCudaMajor == 12 ? "-cu12" : "") + "` (CUDA " + std::to_string(kCudaMajor) +
        ", torch's), or set FLASHMLA_PERM_NVRTC_LIBRARY to its path"
        " (libnvrtc.so." +
        std::to_string(kCudaMajor) + "). Tried:" + tried);
  auto l = std::make_unique<Nvrtc>();
  bind(handle, "nvrtcGetErrorString", l->GetErrorString, path);
  bind(handle, "nvrtcVersion", l->Version, path);
  bind(handle, "nvrtcCreateProgram", l->CreateProgram, path);
  bind(handle, "nvrtcDestroyProgram", l->DestroyProgram, path);
  bind(handle, "nvrtcCompileProgram", l->CompileProgram, path);
  bind(handle, "nvrtcGetCUBINSize", l->GetCUBINSize, path);
  bind(handle, "nvrtcGetCUBIN", l->GetCUBIN, path);
  bind(handle, "nvrtcGetProgramLogSize", l->GetProgramLogSize, path);
  bind(handle, "nvrtcGetProgramLog", l->GetProgramLog, path);
  bind(handle, "nvrtcAddNameExpression", l->AddNameExpression, path);
  bind(handle, "nvrtcGetLoweredName", l->GetLoweredName, path);
  int major = 0, minor = 0;
  l->Version(&major, &minor);
  l->version = std::to_string(major) + "." + std::to_string(minor);
  // NVRTC opens its builtins library by name at compile time; the pip
  // packages' folder is on no search path, so open it first from beside
  // NVRTC (once loaded, the name resolves to it).
  Dl_info info;
  if (dladdr(reinterpret_cast<void*>(l->Version), &info) && info.dli_fname) {
    const std::string builtins = folder_of(info.dli_fname) + "/libnvrtc-builtins.so." + l->version;
    if (exists(builtins)) dlopen(builtins.c_str(), RTLD_NOW | RTLD_GLOBAL);
  }
  l->path = path;
  lib = std::move(l);
  return *lib;
}

void check_nvrtc(const Nvrtc& n, int result, const char* call) {
  if (result != 0) fail(std::string("NVRTC ") + call + " failed: " + n.GetErrorString(result));
}

// ---- the embedded source and its hash -----------------------------------------

uint64_t fnv1a(uint64_t h, const char* data, size_t n) {
  for (size_t i = 0; i < n; ++i) h = (h ^ static_cast<unsigned char>(data[i])) * 1099511628211ull;
  return h;
}
constexpr uint64_t kFnvStart = 14695981039346656037ull;

std::string hex(uint64_t v) {
  char buf[17];
  std::snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(v));
  return buf;
}

// ---- the disk cache -------------------------------------------------------------

// An entry: a header of text lines (magic, the four lowered names, the
// cubin's size and checksum), then the cubin. Anything short of that (a
// truncated or damaged file) is compiled again.
constexpr char kMagic[] = "flashmla_perm nvrtc cubin 2";

// What an entry's checksum covers: the lowered names and the cubin, so that
// a damaged byte in either is compiled again rather than failing each load.
uint64_t checksum(const Compiled& c) {
  uint64_t h = kFnvStart;
  for (const std::string& n : c.names) h = fnv1a(h, n.c_str(), n.size() + 1);
  return fnv1a(h, c.cubin.data(), c.cubin.size());
}

std::string entry_bytes(const Compiled& c) {
  std::ostringstream out;
  out << kMagic << "\n";
  for (const std::string& n : c.names) out << n << "\n";
  out << c.cubin.size() << "\n" << hex(checksum(c)) << "\n" << c.cubin;
  return out.str();
}

bool parse_entry(const std::string& bytes, Compiled& c) {
  std::istringstream in(bytes);
  std::string line;
  if (!std::getline(in, line) || line != kMagic) return false;
  for (std::string& n : c.names)
    if (!std::getline(in, n) || n.empty()) return false;
  std::string size_text, sum;
  if (!std::getline(in, size_text) || !std::getline(in, sum)) return false;
  char* end = nullptr;
  const unsigned long long size = std::strtoull(size_text.c_str(), &end, 10);
  if (end == size_text.c_str() || *end != '\0') return false;
  const std::streamoff at = in.tellg();
  if (at < 0 || bytes.size() - static_cast<size_t>(at) != size) return false;
  c.cubin = bytes.substr(static_cast<size_t>(at));
  return hex(checksum(c)) == sum;
}

// Only a regular file of this user's that no one else may write is read: a
// cubin another user planted in a shared cache folder would run on this
// process's tensors.
bool own_file(const std::string& path) {
  struct stat st;
  return ::lstat(path.c_str(), &st) == 0 && S_ISREG(st.st_mode) && st.st_uid == ::geteuid() &&
         (st.st_mode & (S_IWGRP | S_IWOTH)) == 0;
}

bool read_file(const std::string& path, std::string& out) {
  if (!own_file(path)) return false;
  std::ifstream f(path, std::ios::binary);
  if (!f) return false;
  std::ostringstream s;
  s << f.rdbuf();
  out = s.str();
  return true;
}

void make_dirs(const std::string& path) {
  for (size_t i = 1; i <= path.size(); ++i)
    if (i == path.size() || path[i] == '/') ::mkdir(path.substr(0, i).c_str(), 0755);
}

// Writes a file of this process's own and renames it into place: a reader
// sees the old entry or the whole new one, never part of one. A cache that
// cannot be written is no error (the kernels were compiled all the same).
void write_entry(const std::string& dir, const std::string& path, const std::string& bytes) {
  static std::atomic<int> counter{0};
  make_dirs(dir);
  const std::string tmp = path + ".tmp." + std::to_string(::getpid()) + "." + std::to_string(counter++);
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL, 0644);
  if (fd < 0) return;
  size_t done = 0;
  while (done < bytes.size()) {
    const ssize_t n = ::write(fd, bytes.data() + done, bytes.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    done += static_cast<size_t>(n);
  }
  const bool ok = done == bytes.size() && ::fsync(fd) == 0;
  ::close(fd);
  if (!ok || std::rename(tmp.c_str(), path.c_str()) != 0) ::unlink(tmp.c_str());
}

// ---- the driver API, opened at first use -------------------------------------

using CUresult = int;
using CUmodule = void*;
using CUfunction = void*;
constexpr int kAttrNumRegs = 4;           // CU_FUNC_ATTRIBUTE_NUM_REGS
constexpr int kAttrCarveout = 9;          // CU_FUNC_ATTRIBUTE_PREFERRED_SHARED_MEMORY_CARVEOUT
constexpr int kCarveoutMaxShared = 100;   // cudaSharedmemCarveoutMaxShared
struct Driver {
  CUresult (*ModuleLoadData)(CUmodule*, const void*);
  CUresult (*ModuleGetFunction)(CUfunction*, CUmodule, const char*);
  CUresult (*FuncGetAttribute)(int*, int, CUfunction);
  CUresult (*FuncSetAttribute)(CUfunction, int, int);
  CUresult (*OccupancyMaxActiveBlocksPerMultiprocessor)(int*, CUfunction, int, size_t);
  CUresult (*LaunchKernel)(CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned,
                           void*, void**, void**);
  CUresult (*GetErrorString)(CUresult, const char**);
};

const Driver& driver() {
  static std::once_flag once;
  static Driver d;
  std::call_once(once, [] {
    // torch has the driver library loaded wherever a GPU is in use.
    void* lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    if (!lib) fail(std::string("cannot open the CUDA driver library libcuda.so.1: ") + dlerror());
    const std::string path = "libcuda.so.1";
    bind(lib, "cuModuleLoadData", d.ModuleLoadData, path);
    bind(lib, "cuModuleGetFunction", d.ModuleGetFunction, path);
    bind(lib, "cuFuncGetAttribute", d.FuncGetAttribute, path);
    bind(lib, "cuFuncSetAttribute", d.FuncSetAttribute, path);
    bind(lib, "cuOccupancyMaxActiveBlocksPerMultiprocessor", d.OccupancyMaxActiveBlocksPerMultiprocessor,
         path);
    bind(lib, "cuLaunchKernel", d.LaunchKernel, path);
    bind(lib, "cuGetErrorString", d.GetErrorString, path);
  });
  return d;
}

void check_cu(CUresult r, const char* call) {
  if (r == 0) return;
  const char* text = nullptr;
  driver().GetErrorString(r, &text);
  fail(std::string(call) + " failed: " + (text ? text : "error " + std::to_string(r)));
}

struct Loaded {
  CUmodule module = nullptr;
  CUfunction functions[4] = {};
};
std::mutex loaded_mu;
std::map<int, Loaded> loaded_by_device;

Loaded loaded_on(int device) {
  std::lock_guard<std::mutex> lock(loaded_mu);
  const auto it = loaded_by_device.find(device);
  if (it == loaded_by_device.end())
    fail("the NVRTC kernels are not loaded on device " + std::to_string(device));
  return it->second;
}

}  // namespace

const char* cuda_compiler() {
#ifdef FLASHMLA_PERM_NVCC_KERNELS
  static const bool forced = [] {
    const char* v = std::getenv("FLASHMLA_PERM_CUDA");
    return v != nullptr && std::strcmp(v, "nvrtc") == 0;
  }();
  return forced ? "nvrtc" : "nvcc";
#else
  return "nvrtc";
#endif
}

std::string source_hash(const std::string& extra, const std::string& main) {
  uint64_t h = kFnvStart;
  for (int i = 0; i < kEmbeddedFiles; ++i) {
    const char* text = i == 0 && !main.empty() ? main.c_str() : kEmbeddedTexts[i];
    h = fnv1a(h, kEmbeddedNames[i], std::strlen(kEmbeddedNames[i]) + 1);
    h = fnv1a(h, text, std::strlen(text) + 1);
  }
  // And all else the cubin depends on: the shims, the kernels' names, the options.
  for (const char* text : kShims) h = fnv1a(h, text, std::strlen(text) + 1);
  for (const char* e : kKernelExpressions) h = fnv1a(h, e, std::strlen(e) + 1);
  for (const char* o : kOptions) h = fnv1a(h, o, std::strlen(o) + 1);
  return hex(fnv1a(h, extra.data(), extra.size()));
}

std::string version() { return nvrtc_library().version; }

std::string cache_dir() {
  if (const char* dir = std::getenv("FLASHMLA_PERM_CACHE_DIR"); dir && *dir) return dir;
  if (const char* xdg = std::getenv("XDG_CACHE_HOME"); xdg && *xdg)
    return std::string(xdg) + "/flashmla_perm";
  if (const char* home = std::getenv("HOME"); home && *home)
    return std::string(home) + "/.cache/flashmla_perm";
  return "/tmp/flashmla_perm-" + std::to_string(::geteuid());  // a folder per user
}

Compiled compile(const std::string& arch, const std::string& extra, const std::string& main) {
  const Nvrtc& n = nvrtc_library();
  std::vector<const char*> headers, names;
  for (int i = 1; i < kEmbeddedFiles; ++i) {
    headers.push_back(kEmbeddedTexts[i]);
    names.push_back(kEmbeddedNames[i]);
  }
  for (int i = 0; i < 3; ++i) {
    headers.push_back(kShims[i]);
    names.push_back(kShimNames[i]);
  }
  const std::string source = (main.empty() ? std::string(kEmbeddedTexts[0]) : main) + extra;
  nvrtcProgram prog = nullptr;
  check_nvrtc(n,
              n.CreateProgram(&prog, source.c_str(), kEmbeddedNames[0], static_cast<int>(headers.size()),
                              headers.data(), names.data()),
              "nvrtcCreateProgram");
  const std::unique_ptr<nvrtcProgram, void (*)(nvrtcProgram*)> guard(
      &prog, [](nvrtcProgram* p) { nvrtc_library().DestroyProgram(p); });
  for (const char* e : kKernelExpressions)
    check_nvrtc(n, n.AddNameExpression(prog, e), "nvrtcAddNameExpression");
  const std::string gpu = "--gpu-architecture=" + arch;
  std::vector<const char*> options = {gpu.c_str()};
  options.insert(options.end(), std::begin(kOptions), std::end(kOptions));
  const auto start = std::chrono::steady_clock::now();
  const int result = n.CompileProgram(prog, static_cast<int>(options.size()), options.data());
  Compiled c;
  c.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  size_t size = 0;
  n.GetProgramLogSize(prog, &size);
  c.log.assign(size, '\0');
  if (size) n.GetProgramLog(prog, c.log.data());
  while (!c.log.empty() && c.log.back() == '\0') c.log.pop_back();
  if (result != 0)
    fail("NVRTC " + n.version + " failed to compile the kernels for " + arch + ": " +
         n.GetErrorString(result) + "\n" + c.log);
  check_nvrtc(n, n.GetCUBINSize(prog, &size), "nvrtcGetCUBINSize");
  c.cubin.assign(size, '\0');
  check_nvrtc(n, n.GetCUBIN(prog, c.cubin.data()), "nvrtcGetCUBIN");
  for (int i = 0; i < 4; ++i) {
    const char* lowered = nullptr;
    check_nvrtc(n, n.GetLoweredName(prog, kKernelExpressions[i], &lowered), "nvrtcGetLoweredName");
    c.names[i] = lowered;
  }
  return c;
}

CacheEntry cached(const std::string& arch, const std::string& extra, const std::string& main) {
  const std::string dir = cache_dir() + "/nvrtc";
  CacheEntry e;
  e.path = dir + "/kernels-" + source_hash(extra, main) + "-" + arch + "-nvrtc" + version() + ".cubin";
  std::string bytes;
  if (read_file(e.path, bytes) && parse_entry(bytes, e.code)) return e;
  e.code = compile(arch, extra, main);
  e.compiled = true;
  write_entry(dir, e.path, entry_bytes(e.code));
  return e;
}

bool loaded(int device) {
  std::lock_guard<std::mutex> lock(loaded_mu);
  return loaded_by_device.count(device) > 0;
}

void load(int device, int cc_major, int cc_minor) {
  static std::mutex load_mu;  // one compile at a time in a process
  std::lock_guard<std::mutex> lock(load_mu);
  if (loaded(device)) return;
  const std::string arch = "sm_" + std::to_string(cc_major) + std::to_string(cc_minor);
  const CacheEntry e = cached(arch);
  const Driver& d = driver();
  Loaded l;
  check_cu(d.ModuleLoadData(&l.module, e.code.cubin.data()), "cuModuleLoadData (the NVRTC kernels)");
  for (int i = 0; i < 4; ++i)
    check_cu(d.ModuleGetFunction(&l.functions[i], l.module, e.code.names[i].c_str()), "cuModuleGetFunction");
  std::lock_guard<std::mutex> lock2(loaded_mu);
  loaded_by_device[device] = l;
}

void query_kernel_registers(int device, DeviceSpec& spec) {
  const Loaded l = loaded_on(device);
  const Driver& d = driver();
  int regs[4];
  for (int k = 0; k < 4; ++k) {
    check_cu(d.FuncSetAttribute(l.functions[k], kAttrCarveout, kCarveoutMaxShared), "cuFuncSetAttribute");
    check_cu(d.FuncGetAttribute(&regs[k], kAttrNumRegs, l.functions[k]), "cuFuncGetAttribute");
  }
  spec.regs[static_cast<int>(Kernel::kRows)] = regs[0];
  spec.regs[static_cast<int>(Kernel::kSaveHeads)] = regs[1];
  spec.regs[static_cast<int>(Kernel::kCols)] = regs[2] > regs[3] ? regs[2] : regs[3];
}

int resident_ctas_per_sm(int device, Kernel kernel, int threads, int64_t smem_bytes) {
  const Loaded l = loaded_on(device);
  const int first = kernel == Kernel::kCols ? 2 : static_cast<int>(kernel);
  const int last = kernel == Kernel::kCols ? 3 : first;
  int ctas = 0;
  for (int k = first; k <= last; ++k) {
    int n = 0;
    check_cu(driver().OccupancyMaxActiveBlocksPerMultiprocessor(&n, l.functions[k], threads,
                                                                static_cast<size_t>(smem_bytes)),
             "cuOccupancyMaxActiveBlocksPerMultiprocessor");
    ctas = k == first ? n : (n < ctas ? n : ctas);
  }
  return ctas;
}

void launch_kernel(int device, const Launch& l, void* stream) {
  const Loaded loaded = loaded_on(device);
  const unsigned grid = static_cast<unsigned>(l.grid), block = static_cast<unsigned>(l.threads);
  CUfunction f;
  Jobs<ColJob> cols = col_jobs(l);
  Jobs<RowJob> rows = row_jobs(l);
  void* args[1];
  unsigned smem = static_cast<unsigned>(l.smem_bytes);
  if (l.kernel == Kernel::kCols) {
    f = loaded.functions[l.cols[0].staged ? 2 : 3];
    args[0] = &cols;
  } else {
    f = loaded.functions[static_cast<int>(l.kernel)];
    args[0] = &rows;
    if (l.kernel == Kernel::kSaveHeads) smem = 0;
  }
  check_cu(driver().LaunchKernel(f, grid, 1, 1, block, 1, 1, smem, stream, args, nullptr), "cuLaunchKernel");
}

}  // namespace nvrtc
}  // namespace flashmla_perm

#endif  // FLASHMLA_PERM_WITH_CUDA
