// NVRTC: the kernels compiled from their source, embedded in the binary
// (csrc/cuda/kernels.cu and the headers it names, by
// scripts/build_kernels.py), for one architecture. Used at install by the
// compile tool (csrc/cuda/compile_tool.cpp) where no nvcc of torch's CUDA
// major is found, and at first use by the module for an architecture the
// install did not build. NVRTC is opened with dlopen, never linked. Plain
// C++; failures throw std::runtime_error with the whole story.
#pragma once

#include <string>
#include <vector>

namespace flashmla_perm {
namespace cuda {
namespace nvrtc {

// Where torch's libraries are (torch/lib): the nvidia-cuda-nvrtc package
// torch's CUDA wheels bring lies beside them. Set before the first use.
void set_torch_lib_dir(const std::string& dir);

// Where NVRTC is looked for, in order, after the one the process may
// already hold (absolute paths only); `skipped` gets what was passed over.
std::vector<std::string> candidates(std::string& skipped);

struct Library {
  std::string path;      // the file loaded
  std::string version;   // "13.0", as NVRTC reports itself
  std::string identity;  // the file's size and time: tells apart releases of one major.minor
};
// NVRTC of torch's CUDA major, loaded at first use. Throws, naming the
// package to install, where none is found.
const Library& library();
// The architectures it compiles for, as numbers (90 for sm_90).
std::vector<int> supported_archs();

struct Compiled {
  std::string cubin;
  std::string log;  // NVRTC's log, ptxas's resource report (-Xptxas=-v) among it
  double seconds = 0;
};
// Compiles the embedded source for `arch` ("sm_90"). For the tests: `extra`
// is appended to the main source, and a non-empty `main` replaces it (a
// small source defining the same four kernels compiles in milliseconds).
Compiled compile(const std::string& arch, const std::string& extra = "", const std::string& main = "");

// A hash of everything compile() turns into a cubin besides the
// architecture and NVRTC itself: the sources (`main` and `extra` as
// compile() takes them), the standard headers NVRTC is given, the options.
std::string source_hash(const std::string& extra = "", const std::string& main = "");

}  // namespace nvrtc
}  // namespace cuda
}  // namespace flashmla_perm
