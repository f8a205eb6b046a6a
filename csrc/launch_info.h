// flashmla_perm._C.gpu_launches: the CUDA executor's launches for a model
// op, computed by launch.h on this host (CPU builds too), for
// bench/gpu_model.py and the tests.
#pragma once

#include <Python.h>

namespace flashmla_perm {

// gpu_launches(op, dims, device=None) -> list of dicts (see launch_info.cpp).
PyObject* gpu_launches_py(PyObject* self, PyObject* args);

}  // namespace flashmla_perm
