#include "launch_info.h"

#include <stdexcept>
#include <string>
#include <vector>

#include "launch.h"
#include "plan.h"
#include "strided.h"

namespace flashmla_perm {
namespace {

// Stand-in addresses: the caching allocator hands out 512-byte aligned
// blocks, and only alignment matters to the plan (nothing is dereferenced).
uint8_t* fake_address(int i) { return reinterpret_cast<uint8_t*>(uintptr_t{1} << 40) + (int64_t{i} << 32); }

bool read_int(PyObject* dict, const char* key, int64_t* out) {
  PyObject* v = PyDict_GetItemString(dict, key);  // borrowed
  if (v == nullptr) return true;
  const long long x = PyLong_AsLongLong(v);
  if (x == -1 && PyErr_Occurred()) return false;
  *out = x;
  return true;
}

bool read_device(PyObject* dict, DeviceSpec* dev) {
  if (dict == nullptr || dict == Py_None) return true;
  if (!PyDict_Check(dict)) {
    PyErr_SetString(PyExc_TypeError, "gpu_launches: device must be a dict or None");
    return false;
  }
  int64_t sm = dev->sm_count, tps = dev->threads_per_sm, rps = dev->regs_per_sm,
          ctas = dev->max_ctas_per_sm, all = -1;
  int64_t regs[3] = {dev->regs[0], dev->regs[1], dev->regs[2]};
  if (!read_int(dict, "sm_count", &sm) || !read_int(dict, "smem_per_sm", &dev->smem_per_sm) ||
      !read_int(dict, "smem_reserved_per_cta", &dev->smem_reserved_per_cta) ||
      !read_int(dict, "threads_per_sm", &tps) || !read_int(dict, "regs_per_sm", &rps) ||
      !read_int(dict, "max_ctas_per_sm", &ctas) || !read_int(dict, "regs_per_thread", &all) ||
      !read_int(dict, "regs_rows", &regs[0]) || !read_int(dict, "regs_save_heads", &regs[1]) ||
      !read_int(dict, "regs_cols", &regs[2]))
    return false;
  dev->sm_count = static_cast<int>(sm);
  dev->threads_per_sm = static_cast<int>(tps);
  dev->regs_per_sm = static_cast<int>(rps);
  dev->max_ctas_per_sm = static_cast<int>(ctas);
  for (int k = 0; k < 3; ++k) dev->regs[k] = static_cast<int>(all > 0 ? all : regs[k]);
  return true;
}

const char* job_kind(const Launch& l, int j) {
  if (l.kernel != Kernel::kCols) return kernel_name(l.kernel);
  return l.cols[j].staged ? "cols_staged" : "cols_direct";
}

PyObject* launch_dict(const Launch& l) {
  PyObject* jobs = PyList_New(0);
  for (int j = 0; j < l.num_jobs; ++j) {
    PyObject* job = Py_BuildValue("{s:s,s:i,s:L,s:L,s:L,s:L}", "kind", job_kind(l, j), "vec", l.vec(j),
                                  "tiles", static_cast<long long>(l.job_tiles(j)), "bytes",
                                  static_cast<long long>(l.bytes[j]), "max_tile_bytes",
                                  static_cast<long long>(l.max_tile_bytes[j]), "inflight_bytes",
                                  static_cast<long long>(l.inflight_bytes[j]));
    PyList_Append(jobs, job);
    Py_DECREF(job);
  }
  PyObject* d = Py_BuildValue("{s:s,s:L,s:i,s:L,s:i,s:L,s:N}", "kernel", kernel_name(l.kernel), "grid",
                              static_cast<long long>(l.grid), "threads", l.threads, "smem_bytes",
                              static_cast<long long>(l.smem_bytes), "ctas_per_sm", l.ctas_per_sm,
                              "tiles", static_cast<long long>(l.tiles), "jobs", jobs);
  return d;
}

int64_t align4(int64_t n) { return (n + 3) / 4 * 4; }

// The views apply.cpp makes (csrc/strided.h), and their launches.
std::vector<Launch> wq_b_launches(int64_t rows, int64_t k, int64_t heads, int64_t scale_words, bool mn_major,
                                  const DeviceSpec& dev) {
  const RowPlan plan = make_row_plan(q_fused_permutation(heads, rows / heads));
  // fp8 weight [rows, k]; scale: uint8 [rows, k / 32], or int32 [rows, W] MN-major (strides (1, align4(rows))).
  const std::vector<UnitView> w = unit_views(fake_address(0), {rows, k}, plan.unit_rows, {{k, 1}}, 1);
  const std::vector<UnitView> s =
      mn_major ? unit_views(fake_address(1), {rows, 4}, plan.unit_rows, {{scale_words, 4 * align4(rows)}}, 4)
               : unit_views(fake_address(1), {rows, k / 32}, plan.unit_rows, {{k / 32, 1}}, 1);
  const UnitView views[] = {w.front(), s.front()};
  return gpu_row_launches(views, 2, plan, nullptr, dev);
}

std::vector<Launch> wo_a_launches(int64_t groups, int64_t out, int64_t cols, int64_t group, bool packed,
                                  const DeviceSpec& dev) {
  const int64_t rows = groups * out;
  const ColPlan w = make_col_plan(o_fused_permutation(group, cols / group), 1);
  const ColPlan s = make_col_plan(o_fused_chunk_permutation(group, cols / group), 1);
  const ColView wv = col_views_in_place(fake_address(0), {{rows, cols}}, cols, cols, cols).front();
  // Packed int32 [groups, out, cols / 128], stride(1) == 1: runs of 4 bytes, words align4(out) * 4 apart.
  const int64_t words = cols / 128, pitch = 4 * align4(out);
  const ColView sv = packed ? col_views_in_place(fake_address(1), {{out, 4}, {groups, words * pitch}}, 4 * words,
                                                 4, pitch).front()
                            : col_views_in_place(fake_address(1), {{rows, cols / 32}}, cols / 32, cols / 32,
                                                 cols / 32).front();
  const ColView views[] = {wv, sv};
  const ColPlan* plans[] = {&w, &s};
  const int32_t* offsets[] = {nullptr, nullptr};
  return gpu_col_launches(views, plans, offsets, 2, dev);
}

// The launches apply.cpp makes for each op.
std::vector<Launch> launches_for(const std::string& op, const std::vector<int64_t>& dims,
                                 const DeviceSpec& dev) {
  if (op == "wq_b" && dims.size() == 3)  // rows, k, num_local_heads (fp8 weight, per-32 uint8 scale)
    return wq_b_launches(dims[0], dims[1], dims[2], 0, false, dev);
  if (op == "wq_b_packed" && dims.size() == 4)  // rows, k, num_local_heads, gran (MN-major int32 scale)
    return wq_b_launches(dims[0], dims[1], dims[2], dims[1] / (4 * dims[3]), true, dev);
  if (op == "wo_a" && dims.size() == 3)  // rows, cols, heads_per_group
    return wo_a_launches(1, dims[0], dims[1], dims[2], false, dev);
  if (op == "wv_packed" && dims.size() == 4)  // n_groups, out, cols, heads_per_group (3-D, packed MN-major scale)
    return wo_a_launches(dims[0], dims[1], dims[2], dims[3], true, dev);
  if (op == "permute_q" && dims.size() == 4) {  // tokens, heads, head_dim, element_size
    const int64_t tokens = dims[0], heads = dims[1], head_dim = dims[2], esize = dims[3];
    const ColPlan plan = make_col_plan(q_fused_permutation(heads, head_dim), esize);
    const int64_t row = heads * head_dim * esize;
    const ColView view = col_rows(fake_address(0), fake_address(1), tokens, row, row, row);
    const ColPlan* plans[] = {&plan};
    const int32_t* offsets[] = {nullptr};
    return gpu_col_launches(&view, plans, offsets, 1, dev);
  }
  throw std::invalid_argument(
      "gpu_launches: op must be 'wq_b' (rows, k, num_local_heads), 'wq_b_packed' (rows, k, "
      "num_local_heads, gran), 'wo_a' (rows, cols, heads_per_group), 'wv_packed' (n_groups, out, "
      "cols, heads_per_group) or 'permute_q' (tokens, heads, head_dim, element_size), got '" + op +
      "' with " + std::to_string(dims.size()) + " dims");
}

}  // namespace

// gpu_launches(op, dims, device=None): op as launches_for above; device: DeviceSpec fields (launch.h), H200 by
// default; registers as regs_rows, regs_save_heads, regs_cols, or
// regs_per_thread for all three. Returns one dict per launch: kernel, grid, threads, smem_bytes,
// ctas_per_sm, tiles, jobs (kind, vec, tiles, bytes, max_tile_bytes,
// inflight_bytes).
PyObject* gpu_launches_py(PyObject*, PyObject* args) {
  const char* op = nullptr;
  PyObject* dims_obj = nullptr;
  PyObject* device = nullptr;
  if (!PyArg_ParseTuple(args, "sO|O", &op, &dims_obj, &device)) return nullptr;
  PyObject* seq = PySequence_Fast(dims_obj, "gpu_launches: dims must be a sequence of ints");
  if (seq == nullptr) return nullptr;
  std::vector<int64_t> dims;
  for (Py_ssize_t i = 0; i < PySequence_Fast_GET_SIZE(seq); ++i) {
    const long long v = PyLong_AsLongLong(PySequence_Fast_GET_ITEM(seq, i));
    if (v == -1 && PyErr_Occurred()) {
      Py_DECREF(seq);
      return nullptr;
    }
    if (v <= 0) {
      Py_DECREF(seq);
      PyErr_SetString(PyExc_ValueError, "gpu_launches: dims must be positive");
      return nullptr;
    }
    dims.push_back(v);
  }
  Py_DECREF(seq);
  DeviceSpec dev;
  if (!read_device(device, &dev)) return nullptr;
  try {
    const std::vector<Launch> launches = launches_for(op, dims, dev);
    PyObject* list = PyList_New(0);
    for (const Launch& l : launches) {
      PyObject* d = launch_dict(l);
      PyList_Append(list, d);
      Py_DECREF(d);
    }
    return list;
  } catch (const std::exception& e) {
    PyErr_SetString(PyExc_ValueError, e.what());
    return nullptr;
  }
}

}  // namespace flashmla_perm
