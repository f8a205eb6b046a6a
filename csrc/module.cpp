// The Python module flashmla_perm._C: importing it registers the ops (static
// initializers in ops.cpp) and exposes what was built. Plain CPython API, so
// no translation unit pays for pybind11.
#include <Python.h>

#include "apply.h"
#include "launch_info.h"
#include "perm_cache.h"
#include "overlap.h"
#include "plan_cache.h"

#ifndef FLASHMLA_PERM_CUDA_ARCHS
#define FLASHMLA_PERM_CUDA_ARCHS ""
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

#ifdef FLASHMLA_PERM_WITH_CUDA
constexpr bool kWithCuda = true;
#else
constexpr bool kWithCuda = false;
#endif

PyObject* build_info(PyObject*, PyObject*) {
  // The stamp lies in the binary as one literal: flashmla_perm/_ops.py reads
  // it from the file when the module fails to load (built for another torch).
  static const char stamp[] = "flashmla_perm built for torch " FLASHMLA_PERM_TORCH_BUILD;
  return Py_BuildValue("{s:O,s:s,s:s,s:s,s:s}", "cuda", kWithCuda ? Py_True : Py_False,
                       "cuda_archs", FLASHMLA_PERM_CUDA_ARCHS, "torch", FLASHMLA_PERM_TORCH_VERSION,
                       "cuda_off_reason", kWithCuda ? "" : FLASHMLA_PERM_CUDA_OFF_REASON, "stamp",
                       stamp);
}

PyObject* path_counts(PyObject*, PyObject*) {
  using flashmla_perm::Path;
  using flashmla_perm::path_count;
  return Py_BuildValue("{s:L,s:L,s:L}", "cpu", static_cast<long long>(path_count(Path::kCpu)),
                       "cuda", static_cast<long long>(path_count(Path::kCuda)), "aten",
                       static_cast<long long>(path_count(Path::kAten)));
}

PyObject* cached_plans(PyObject*, PyObject*) {
  return PyLong_FromLongLong(flashmla_perm::cached_plan_count());
}

PyObject* plan_stats(PyObject*, PyObject*) {
  return Py_BuildValue("{s:L,s:L,s:L}", "model_plans",
                       static_cast<long long>(flashmla_perm::cached_plan_count()), "prepared",
                       static_cast<long long>(flashmla_perm::prepared_count()), "built",
                       static_cast<long long>(flashmla_perm::plans_built()));
}

PyObject* clear_plan_caches(PyObject*, PyObject*) {
  flashmla_perm::clear_model_plans();
  flashmla_perm::clear_prepared();
  Py_RETURN_NONE;
}

// byte_overlap(a, b=None): csrc/overlap.h on layouts (offset, element_size,
// ((size, pitch), ...)) in bytes, b None for a's self-overlap; "no", "yes" or
// "unknown". Tests hold it against brute force and flashmla_perm/_overlap.py.
PyObject* byte_overlap(PyObject*, PyObject* args) {
  auto parse = [](PyObject* o, flashmla_perm::ByteLayout* t) {
    PyObject* dims = nullptr;
    long long offset = 0, element_size = 0, size = 0, pitch = 0;
    if (!PyArg_ParseTuple(o, "LLO!", &offset, &element_size, &PyTuple_Type, &dims)) return false;
    *t = {static_cast<int64_t>(offset), static_cast<int64_t>(element_size), {}};
    for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(dims); ++i) {
      if (!PyArg_ParseTuple(PyTuple_GET_ITEM(dims, i), "LL", &size, &pitch)) return false;
      t->dims.push_back({static_cast<int64_t>(size), static_cast<int64_t>(pitch)});
    }
    return true;
  };
  PyObject *a_obj = nullptr, *b_obj = Py_None;
  flashmla_perm::ByteLayout a{}, b{};
  if (!PyArg_ParseTuple(args, "O|O", &a_obj, &b_obj) || !parse(a_obj, &a) || (b_obj != Py_None && !parse(b_obj, &b)))
    return nullptr;
  const auto o = b_obj == Py_None ? flashmla_perm::self_overlap(a) : flashmla_perm::overlap(a, b);
  static const char* const names[] = {"no", "yes", "unknown"};
  return PyUnicode_FromString(names[static_cast<int>(o)]);
}

PyMethodDef methods[] = {
    {"build_info", build_info, METH_NOARGS, "What this module was built with."},
    {"path_counts", path_counts, METH_NOARGS, "Calls served by each path (cpu, cuda, aten)."},
    {"cached_plans", cached_plans, METH_NOARGS, "Model-level plans held by the cache."},
    {"plan_stats", plan_stats, METH_NOARGS,
     "model_plans and prepared (permutations) held by the caches; plans built since load."},
    {"clear_plan_caches", clear_plan_caches, METH_NOARGS, "Empties the plan caches (tests)."},
    {"gpu_launches", flashmla_perm::gpu_launches_py, METH_VARARGS,
     "gpu_launches(op, dims, device=None): the CUDA executor's launches for a model op."},
    {"byte_overlap", byte_overlap, METH_VARARGS, "byte_overlap(a, b=None): csrc/overlap.h's answer."},
    {nullptr, nullptr, 0, nullptr}};

PyModuleDef module = {PyModuleDef_HEAD_INIT, "_C", "flashmla_perm native ops", -1, methods};

}  // namespace

PyMODINIT_FUNC PyInit__C() { return PyModule_Create(&module); }
