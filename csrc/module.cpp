// The Python module flashmla_perm._C: importing it registers the ops (static
// initializers in ops.cpp, on TORCH_LIBRARY) and exposes what was built and a
// few helpers for the tests and the benchmarks. The only translation unit
// that includes pybind11 (its headers cost every file that includes them
// seconds of build time): the helpers' code elsewhere speaks plain C++.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <optional>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

// Plain C++ headers only: ATen's would double this file's build time.
#include "counters.h"
#include "launch_info.h"
#include "overlap.h"
#ifdef FLASHMLA_PERM_WITH_CUDA
#include "cuda/kernels.h"
#endif

#ifndef FLASHMLA_PERM_TORCH_VERSION
#define FLASHMLA_PERM_TORCH_VERSION "unknown"
#endif
#ifndef FLASHMLA_PERM_TORCH_BUILD  // torch.__version__ in full, e.g. "2.9.1+cu128"
#define FLASHMLA_PERM_TORCH_BUILD FLASHMLA_PERM_TORCH_VERSION
#endif
#ifndef FLASHMLA_PERM_CUDA_OFF_REASON  // why the CUDA kernels are off; "" when on
#define FLASHMLA_PERM_CUDA_OFF_REASON "unknown (built without a reason)"
#endif

namespace {

namespace py = pybind11;
namespace fp = flashmla_perm;

#ifdef FLASHMLA_PERM_WITH_CUDA
constexpr bool kWithCuda = true;
#else
constexpr bool kWithCuda = false;
#endif

py::dict build_info() {
  // The stamp lies in the binary as one literal: flashmla_perm/_ops.py reads
  // it from the file when the module fails to load (built for another torch).
  static const char stamp[] = "flashmla_perm built for torch " FLASHMLA_PERM_TORCH_BUILD;
  py::dict d;
  d["cuda"] = kWithCuda;
  // The images built at install ("sm_90", ..., "compute_80") and their
  // compiler ("NVRTC 13.0"); none without the CUDA side.
  py::list images;
  std::string compiler;
#ifdef FLASHMLA_PERM_WITH_CUDA
  for (const std::string& image : fp::cuda::installed()) images.append(image);
  compiler = fp::cuda::compiler();
#endif
  d["images"] = images;
  d["cuda_compiler"] = compiler;
  d["torch"] = FLASHMLA_PERM_TORCH_VERSION;
  d["cuda_off_reason"] = kWithCuda ? "" : FLASHMLA_PERM_CUDA_OFF_REASON;
  d["stamp"] = stamp;
  return d;
}

py::dict path_counts() {
  py::dict d;
  d["cpu"] = fp::path_count(fp::Path::kCpu);
  d["cuda"] = fp::path_count(fp::Path::kCuda);
  d["aten"] = fp::path_count(fp::Path::kAten);
  return d;
}

py::dict plan_stats() {
  py::dict d;
  d["model_plans"] = fp::cached_plan_count();
  d["prepared"] = fp::prepared_count();
  d["built"] = fp::plans_built();
  return d;
}

void clear_plan_caches() {
  fp::clear_model_plans();
  fp::clear_prepared();
}

// gpu_launches: launch_info.h's structs as dicts, one per launch, its jobs a
// list of dicts (device/model.py and the tests read these keys).
py::dict job_dict(const fp::JobInfo& j) {
  py::dict d;
  d["kind"] = j.kind;
  d["vec"] = j.vec;
  d["tiles"] = j.tiles;
  d["bytes"] = j.bytes;
  d["max_tile_bytes"] = j.max_tile_bytes;
  d["inflight_bytes"] = j.inflight_bytes;
  d["gathered_stage"] = j.gathered_stage;
  d["slice_vectors"] = j.slice_vectors;
  d["line_vectors"] = j.line_vectors;
  return d;
}

py::dict launch_dict(const fp::LaunchInfo& l) {
  py::list jobs;
  for (const fp::JobInfo& j : l.jobs) jobs.append(job_dict(j));
  py::dict d;
  d["kernel"] = l.kernel;
  d["grid"] = l.grid;
  d["threads"] = l.threads;
  d["smem_bytes"] = l.smem_bytes;
  d["stages"] = l.stages;
  d["ctas_per_sm"] = l.ctas_per_sm;
  d["tiles"] = l.tiles;
  d["jobs"] = jobs;
  return d;
}

py::list gpu_launches(const std::string& op, const std::vector<int64_t>& dims,
                      const std::optional<fp::DeviceFields>& device) {
  py::list launches;
  for (const fp::LaunchInfo& l : fp::gpu_launches(op, dims, device.value_or(fp::DeviceFields{})))
    launches.append(launch_dict(l));
  return launches;
}

// byte_overlap's layouts: (offset, element_size, ((size, pitch), ...)), bytes.
using PyLayout = std::tuple<int64_t, int64_t, std::vector<std::pair<int64_t, int64_t>>>;

fp::ByteLayout byte_layout(const PyLayout& t) {
  fp::ByteLayout layout{std::get<0>(t), std::get<1>(t), {}};
  for (const auto& [size, pitch] : std::get<2>(t)) layout.dims.push_back({size, pitch});
  return layout;
}

std::string byte_overlap(const PyLayout& a, const std::optional<PyLayout>& b) {
  const fp::Overlap o = b ? fp::overlap(byte_layout(a), byte_layout(*b)) : fp::self_overlap(byte_layout(a));
  static const char* const names[] = {"no", "yes", "unknown"};
  return names[static_cast<int>(o)];
}

}  // namespace

// PyInit__C, as setup.py and CMakeLists.txt name the module.
PYBIND11_MODULE(_C, m) {
  m.doc() = "flashmla_perm native ops";
  m.def("build_info", &build_info, "What this module was built with.");
  m.def("path_counts", &path_counts, "Calls served by each path (cpu, cuda, aten).");
  m.def("cached_plans", &fp::cached_plan_count, "Model-level plans held by the cache.");
  m.def("plan_stats", &plan_stats,
        "model_plans and prepared (permutations) held by the caches; plans built since load.");
  m.def("clear_plan_caches", &clear_plan_caches, "Empties the plan caches (tests).");
  m.def("gpu_launches", &gpu_launches, py::arg("op"), py::arg("dims"), py::arg("device") = py::none(),
        "gpu_launches(op, dims, device=None): the CUDA executor's launches for a model op "
        "(csrc/launch_info.h); device: DeviceSpec fields by name, an H200's by default.");
  m.def(
      "gpu_device_fields",
      [](const std::optional<fp::DeviceFields>& device) {
        return fp::device_fields(device.value_or(fp::DeviceFields{}));
      },
      py::arg("device") = py::none(),
      "gpu_device_fields(device=None): every DeviceSpec field gpu_launches plans with for these fields "
      "(an H200's where absent).");
  m.def("cuda_device_fields", &fp::cuda_device_fields, py::arg("device") = 0,
        "cuda_device_fields(device=0): the DeviceSpec the CUDA executor plans with on that GPU, as "
        "gpu_launches' device fields (CUDA builds).");
  m.def("cuda_resident_ctas_per_sm", &fp::cuda_resident_ctas_per_sm, py::arg("kernel"), py::arg("threads"),
        py::arg("smem_bytes"), py::arg("device") = 0,
        "cuda_resident_ctas_per_sm(kernel, threads, smem_bytes, device=0): CTAs per SM by the CUDA runtime's "
        "occupancy calculator, for holding gpu_launches' ctas_per_sm against (CUDA builds).");
  m.def(
      "cuda_driver_launches",
      [](const std::string& op, const std::vector<int64_t>& dims, int device) {
        py::list launches;
        for (const fp::LaunchInfo& l : fp::cuda_driver_launches(op, dims, device))
          launches.append(launch_dict(l));
        return launches;
      },
      py::arg("op"), py::arg("dims"), py::arg("device") = 0,
      "cuda_driver_launches(op, dims, device=0): gpu_launches' launches planned with that GPU's figures and "
      "kernels, checked and enqueued through the driver: the stand-in driver's tests (tests/stub_cuda).");
#ifdef FLASHMLA_PERM_WITH_CUDA
  m.def(
      "load_kernels",
      [](int device) {
        fp::cuda::load(device);
        return fp::cuda::device_origin(device);
      },
      py::arg("device"),
      "load_kernels(device): the kernels loaded on that CUDA device (torch's index) through the driver, as "
      "its first call loads them; what loaded ('sm_90 cubin ...', 'compute_80 PTX ...') or why none did.");
  m.def("device_kernels", &fp::cuda::device_origins,
        "device_kernels(): {device: what load_kernels says} for each device loaded so far; no CUDA call.");
#endif
  // csrc/overlap.h on byte layouts, b None for a's self-overlap: "no", "yes"
  // or "unknown". Tests hold it against brute force and flashmla_perm/_overlap.py.
  m.def("byte_overlap", &byte_overlap, py::arg("a"), py::arg("b") = py::none(),
        "byte_overlap(a, b=None): csrc/overlap.h's answer.");
}
