// The install's compiler where no nvcc of torch's CUDA major is found:
// compiles the embedded kernel source with NVRTC (csrc/cuda/nvrtc.cpp, the
// same code the module compiles with at first use) for one architecture,
// writes the cubin, and prints NVRTC's log (ptxas's resource report) for the
// build log's gates. Built and run by scripts/build_kernels.py, one process
// per architecture, side by side.
//
//   flashmla_perm_compile --torch-lib DIR --arch sm_90 --out FILE
//   flashmla_perm_compile --torch-lib DIR --version | --supported
#include <cstdio>
#include <cstring>
#include <exception>
#include <fstream>
#include <stdexcept>
#include <string>

#include "cuda/nvrtc.h"

int main(int argc, char** argv) {
  namespace nvrtc = flashmla_perm::cuda::nvrtc;
  std::string arch, torch_lib, out, mode = "compile";
  for (int i = 1; i < argc; ++i) {
    const std::string flag = argv[i];
    if ((flag == "--version" || flag == "--supported")) {
      mode = flag.substr(2);
    } else if (i + 1 < argc && (flag == "--arch" || flag == "--torch-lib" || flag == "--out")) {
      (flag == "--arch" ? arch : flag == "--out" ? out : torch_lib) = argv[++i];
    } else {
      std::fprintf(stderr, "usage: %s --torch-lib DIR (--arch sm_XY --out FILE | --version | --supported)\n",
                   argv[0]);
      return 2;
    }
  }
  try {
    nvrtc::set_torch_lib_dir(torch_lib);
    if (mode == "version") {
      std::printf("%s\n", nvrtc::library().version.c_str());
    } else if (mode == "supported") {
      for (int a : nvrtc::supported_archs()) std::printf("%d\n", a);
    } else {
      if (arch.empty() || out.empty()) throw std::invalid_argument("--arch and --out are needed to compile");
      const nvrtc::Compiled c = nvrtc::compile(arch);
      std::ofstream f(out, std::ios::binary);
      f.write(c.cubin.data(), static_cast<std::streamsize>(c.cubin.size()));
      if (!f.flush()) throw std::runtime_error("cannot write " + out);
      std::printf("%s\nflashmla_perm: %s compiled by NVRTC %s in %.1f s (%zu bytes)\n", c.log.c_str(),
                  arch.c_str(), nvrtc::library().version.c_str(), c.seconds, c.cubin.size());
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "%s\n", e.what());
    return 1;
  }
  return 0;
}
