#include "cuda/nvrtc.h"

#include <dlfcn.h>
#include <sys/stat.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <vector>

#include "cuda/fnv.h"
#include "nvrtc_sources.h"  // generated at build time (scripts/build_kernels.py)

#ifndef FLASHMLA_PERM_CUDA_MAJOR
#error "FLASHMLA_PERM_CUDA_MAJOR (torch's CUDA major version) must be defined by the build"
#endif

namespace flashmla_perm {
namespace cuda {
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

[[noreturn]] void fail(const std::string& what) { throw std::runtime_error("flashmla_perm: " + what); }

using nvrtcProgram = void*;
struct Functions {
  const char* (*GetErrorString)(int);
  int (*Version)(int*, int*);
  int (*CreateProgram)(nvrtcProgram*, const char*, const char*, int, const char* const*, const char* const*);
  int (*DestroyProgram)(nvrtcProgram*);
  int (*CompileProgram)(nvrtcProgram, int, const char* const*);
  int (*GetCUBINSize)(nvrtcProgram, size_t*);
  int (*GetCUBIN)(nvrtcProgram, char*);
  int (*GetProgramLogSize)(nvrtcProgram, size_t*);
  int (*GetProgramLog)(nvrtcProgram, char*);
  int (*GetNumSupportedArchs)(int*);
  int (*GetSupportedArchs)(int*);
};

struct Loaded {
  Library library;
  Functions f;
};

std::mutex dir_mu;
std::string torch_lib_dir;

const std::string kSoname = "libnvrtc.so." + std::to_string(FLASHMLA_PERM_CUDA_MAJOR);

std::string folder_of(const std::string& path) {
  const size_t slash = path.rfind('/');
  return slash == std::string::npos ? "." : path.substr(0, slash);
}

bool exists(const std::string& path) {
  struct stat st;
  return ::stat(path.c_str(), &st) == 0;
}

}  // namespace

// Absolute paths only (a relative one would load whatever the working folder
// holds, and run its constructor): FLASHMLA_PERM_NVRTC_LIBRARY alone where
// set; else beside torch (the nvidia pip packages: CUDA 13's nvidia/cu13/lib,
// CUDA 12's nvidia/cuda_nvrtc/lib), the toolkit of CUDA_HOME or CUDA_PATH,
// /usr/local/cuda.
std::vector<std::string> candidates(std::string& skipped) {
  if (const char* forced = std::getenv("FLASHMLA_PERM_NVRTC_LIBRARY"); forced && *forced) {
    if (forced[0] != '/')
      fail(std::string("FLASHMLA_PERM_NVRTC_LIBRARY must be an absolute path, got '") + forced + "'");
    return {forced};
  }
  std::vector<std::string> out;
  std::string torch_dir;
  {
    std::lock_guard<std::mutex> lock(dir_mu);
    torch_dir = torch_lib_dir;
  }
  if (!torch_dir.empty()) {
    const std::string site = folder_of(folder_of(torch_dir));  // .../site-packages
    out.push_back(site + "/nvidia/cu" + std::to_string(FLASHMLA_PERM_CUDA_MAJOR) + "/lib/" + kSoname);
    out.push_back(site + "/nvidia/cuda_nvrtc/lib/" + kSoname);
  }
  for (const char* var : {"CUDA_HOME", "CUDA_PATH"}) {
    const char* home = std::getenv(var);
    if (!home || !*home) continue;
    if (home[0] != '/') {
      skipped += std::string("\n  ") + var + "=" + home + " (not an absolute path: skipped)";
      continue;
    }
    out.push_back(std::string(home) + "/lib64/" + kSoname);
    out.push_back(std::string(home) + "/lib/" + kSoname);
  }
  out.push_back("/usr/local/cuda/lib64/" + kSoname);
  return out;
}

namespace {

template <class F>
void bind(void* lib, const char* name, F& f, const std::string& path) {
  f = reinterpret_cast<F>(dlsym(lib, name));
  if (!f) fail(std::string("NVRTC at ") + path + " has no " + name);
}

// The loaded library file's size and modification time: NVRTC reports
// only its major.minor, and two releases of one major.minor (13.0.48,
// 13.0.88) differ in these. (Its ELF build ID is no better: CUDA 12's
// libnvrtc has a stray PT_NOTE, its build ID only in a section.)
std::string identity_of(const std::string& path) {
  struct stat st;
  if (::stat(path.c_str(), &st) != 0) return "unknown file";
  return std::to_string(st.st_size) + " bytes, modified " +
         std::to_string(static_cast<long long>(st.st_mtime));
}

const Loaded& loaded() {
  static std::mutex mu;
  static std::unique_ptr<Loaded> lib;
  std::lock_guard<std::mutex> lock(mu);
  if (lib) return *lib;
  std::string tried, path;
  const std::vector<std::string> search = candidates(tried);
  // The one torch may hold already, unless FLASHMLA_PERM_NVRTC_LIBRARY names one.
  const char* forced = std::getenv("FLASHMLA_PERM_NVRTC_LIBRARY");
  void* handle = forced && *forced ? nullptr : dlopen(kSoname.c_str(), RTLD_NOW | RTLD_LOCAL | RTLD_NOLOAD);
  if (handle) path = kSoname + " (already loaded)";
  if (!handle) {
    for (const std::string& c : search) {
      if (!exists(c)) {
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
  }
  if (!handle)
    fail(
        "the CUDA kernels for this GPU are compiled by NVRTC, and no NVRTC library was found; install it with"
        " `pip install nvidia-cuda-nvrtc" +
        std::string(FLASHMLA_PERM_CUDA_MAJOR == 12 ? "-cu12" : "") + "` (CUDA " +
        std::to_string(FLASHMLA_PERM_CUDA_MAJOR) +
        ", torch's), or set FLASHMLA_PERM_NVRTC_LIBRARY to its absolute path (" + kSoname +
        "). Tried:" + tried);
  auto l = std::make_unique<Loaded>();
  Functions& f = l->f;
  bind(handle, "nvrtcGetErrorString", f.GetErrorString, path);
  bind(handle, "nvrtcVersion", f.Version, path);
  bind(handle, "nvrtcCreateProgram", f.CreateProgram, path);
  bind(handle, "nvrtcDestroyProgram", f.DestroyProgram, path);
  bind(handle, "nvrtcCompileProgram", f.CompileProgram, path);
  bind(handle, "nvrtcGetCUBINSize", f.GetCUBINSize, path);
  bind(handle, "nvrtcGetCUBIN", f.GetCUBIN, path);
  bind(handle, "nvrtcGetProgramLogSize", f.GetProgramLogSize, path);
  bind(handle, "nvrtcGetProgramLog", f.GetProgramLog, path);
  bind(handle, "nvrtcGetNumSupportedArchs", f.GetNumSupportedArchs, path);
  bind(handle, "nvrtcGetSupportedArchs", f.GetSupportedArchs, path);
  int major = 0, minor = 0;
  f.Version(&major, &minor);
  l->library.version = std::to_string(major) + "." + std::to_string(minor);
  Dl_info info;
  if (dladdr(reinterpret_cast<void*>(f.Version), &info) && info.dli_fname && info.dli_fname[0] == '/') {
    l->library.path = info.dli_fname;
    // NVRTC opens its builtins library by name at compile time; the pip
    // packages' folder is on no search path, so open it first from beside
    // NVRTC (once loaded, the name resolves to it).
    const std::string builtins = folder_of(info.dli_fname) + "/libnvrtc-builtins.so." + l->library.version;
    if (exists(builtins)) dlopen(builtins.c_str(), RTLD_NOW | RTLD_GLOBAL);
  } else {
    l->library.path = path;
  }
  l->library.identity = identity_of(l->library.path);
  lib = std::move(l);
  return *lib;
}

void check(const Functions& f, int result, const char* call) {
  if (result != 0) fail(std::string("NVRTC ") + call + " failed: " + f.GetErrorString(result));
}

}  // namespace

void set_torch_lib_dir(const std::string& dir) {
  std::lock_guard<std::mutex> lock(dir_mu);
  torch_lib_dir = dir;
}

const Library& library() { return loaded().library; }

std::vector<int> supported_archs() {
  const Functions& f = loaded().f;
  int n = 0;
  check(f, f.GetNumSupportedArchs(&n), "nvrtcGetNumSupportedArchs");
  std::vector<int> archs(static_cast<size_t>(n));
  if (n > 0) check(f, f.GetSupportedArchs(archs.data()), "nvrtcGetSupportedArchs");
  return archs;
}

std::string source_hash(const std::string& extra, const std::string& main) {
  uint64_t h = kFnvStart;
  for (int i = 0; i < kEmbeddedFiles; ++i) {
    const char* text = i == 0 && !main.empty() ? main.c_str() : kEmbeddedTexts[i];
    h = fnv1a(h, kEmbeddedNames[i], std::strlen(kEmbeddedNames[i]) + 1);
    h = fnv1a(h, text, std::strlen(text) + 1);
  }
  for (const char* text : kShims) h = fnv1a(h, text, std::strlen(text) + 1);
  for (const char* o : kOptions) h = fnv1a(h, o, std::strlen(o) + 1);
  return hex(fnv1a(h, extra.data(), extra.size()));
}

Compiled compile(const std::string& arch, const std::string& extra, const std::string& main) {
  const Loaded& l = loaded();
  const Functions& f = l.f;
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
  check(f,
        f.CreateProgram(&prog, source.c_str(), kEmbeddedNames[0], static_cast<int>(headers.size()),
                        headers.data(), names.data()),
        "nvrtcCreateProgram");
  const std::unique_ptr<nvrtcProgram, void (*)(nvrtcProgram*)> guard(
      &prog, [](nvrtcProgram* p) { loaded().f.DestroyProgram(p); });
  const std::string gpu = "--gpu-architecture=" + arch;
  std::vector<const char*> options = {gpu.c_str()};
  options.insert(options.end(), std::begin(kOptions), std::end(kOptions));
  const auto start = std::chrono::steady_clock::now();
  const int result = f.CompileProgram(prog, static_cast<int>(options.size()), options.data());
  Compiled c;
  c.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  size_t size = 0;
  f.GetProgramLogSize(prog, &size);
  c.log.assign(size, '\0');
  if (size) f.GetProgramLog(prog, c.log.data());
  while (!c.log.empty() && c.log.back() == '\0') c.log.pop_back();
  if (result != 0)
    fail("NVRTC " + l.library.version + " failed to compile the kernels for " + arch + ": " +
         f.GetErrorString(result) + "\n" + c.log);
  check(f, f.GetCUBINSize(prog, &size), "nvrtcGetCUBINSize");
  c.cubin.assign(size, '\0');
  check(f, f.GetCUBIN(prog, c.cubin.data()), "nvrtcGetCUBIN");
  return c;
}

}  // namespace nvrtc
}  // namespace cuda
}  // namespace flashmla_perm
