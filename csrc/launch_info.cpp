#include "launch_info.h"

#include <stdexcept>
#include <string>
#include <type_traits>
#include <vector>

#include "launch.h"
#include "plan.h"
#include "strided.h"

namespace flashmla_perm {
namespace {

// Stand-in addresses: the caching allocator hands out 512-byte aligned
// blocks, and only alignment matters to the plan (nothing is dereferenced).
uint8_t* fake_address(int i) { return reinterpret_cast<uint8_t*>(uintptr_t{1} << 40) + (int64_t{i} << 32); }

// DeviceSpec's fields by name (f(name, field)): the one list that
// device_spec reads and device_fields writes.
template <class Spec, class F>
void for_each_field(Spec& dev, F f) {
  f("sm_count", dev.sm_count);
  f("smem_per_sm", dev.smem_per_sm);
  f("smem_reserved_per_cta", dev.smem_reserved_per_cta);
  f("threads_per_sm", dev.threads_per_sm);
  f("regs_per_sm", dev.regs_per_sm);
  f("max_ctas_per_sm", dev.max_ctas_per_sm);
  f("col_stages", dev.col_stages);
  f("row_stages", dev.row_stages);
  f("tile_budget", dev.tile_budget);
  f("regs_rows", dev.regs[0]);
  f("regs_save_heads", dev.regs[1]);
  f("regs_cols", dev.regs[2]);
}

DeviceSpec device_spec(const DeviceFields& device) {
  DeviceSpec dev;
  for_each_field(dev, [&](const char* name, auto& field) {
    const auto it = device.find(name);
    if (it != device.end()) field = static_cast<std::remove_reference_t<decltype(field)>>(it->second);
  });
  // regs_per_thread, where positive, sizes all three kernels.
  const auto all = device.find("regs_per_thread");
  if (all != device.end() && all->second > 0)
    for (int& regs : dev.regs) regs = static_cast<int>(all->second);
  return dev;
}

const char* job_kind(const Launch& l, int j) {
  if (l.kernel != Kernel::kCols) return kernel_name(l.kernel);
  return l.cols[j].staged ? "cols_staged" : "cols_direct";
}

}  // namespace

LaunchInfo launch_info(const Launch& l) {
  LaunchInfo info{kernel_name(l.kernel), l.grid,  l.threads, l.smem_bytes, l.stages,
                  l.ctas_per_sm,         l.tiles, {}};
  for (int j = 0; j < l.num_jobs; ++j) {
    const bool cols = l.kernel == Kernel::kCols;
    const int64_t slice = cols ? 0 : l.rows[j].slice_bytes / l.vec(j);
    const int64_t line = cols ? 0 : l.rows[j].line_bytes / l.vec(j);
    info.jobs.push_back({job_kind(l, j), l.vec(j), l.job_tiles(j), l.bytes[j], l.max_tile_bytes[j],
                         l.inflight_bytes[j], cols && gathers_in_stage(l.cols[j], l.vec(j), l.cols[j].staged),
                         slice, line});
  }
  return info;
}

namespace {

int64_t align4(int64_t n) { return (n + 3) / 4 * 4; }

// The views apply.cpp makes (csrc/strided.h), and their launches.
std::vector<Launch> wq_b_launches(int64_t rows, int64_t k, int64_t heads, int64_t scale_words, bool mn_major,
                                  const DeviceSpec& dev) {
  if (rows % heads != 0 || k % 32 != 0)
    throw std::invalid_argument("gpu_launches: wq_b needs rows a multiple of num_local_heads and k of 32");
  const RowPlan plan = make_row_plan(q_fused_permutation(heads, rows / heads));
  // fp8 weight [rows, k]; scale: uint8 [rows, k / 32], or int32 [rows, W] MN-major (strides (1,
  // align4(rows))).
  const std::vector<UnitView> w = unit_views(fake_address(0), {rows, k}, plan.unit_rows, {{k, 1}}, 1);
  const std::vector<UnitView> s =
      mn_major ? unit_views(fake_address(1), {rows, 4}, plan.unit_rows, {{scale_words, 4 * align4(rows)}}, 4)
               : unit_views(fake_address(1), {rows, k / 32}, plan.unit_rows, {{k / 32, 1}}, 1);
  const UnitView views[] = {w.front(), s.front()};
  // A stand-in for the plan's device array too (its parts are offsets into it).
  return gpu_row_launches(views, 2, plan, reinterpret_cast<const int32_t*>(fake_address(2)), dev);
}

std::vector<Launch> wo_a_launches(int64_t groups, int64_t out, int64_t cols, int64_t group, bool packed,
                                  const DeviceSpec& dev) {
  if (cols % group != 0 || cols % (packed ? 128 : 32) != 0)
    throw std::invalid_argument(
        "gpu_launches: wo_a needs cols a multiple of heads_per_group and of 32 (128 packed)");
  const int64_t rows = groups * out;
  const ColPlan w = make_col_plan(o_fused_permutation(group, cols / group), 1);
  const ColPlan s = make_col_plan(o_fused_chunk_permutation(group, cols / group), 1);
  const ColView wv = col_views_in_place(fake_address(0), {{rows, cols}}, cols, cols, cols).front();
  // Packed int32 [groups, out, cols / 128], stride(1) == 1: runs of 4 bytes, words align4(out) * 4 apart.
  const int64_t words = cols / 128, pitch = 4 * align4(out);
  const ColView sv =
      packed
          ? col_views_in_place(fake_address(1), {{out, 4}, {groups, words * pitch}}, 4 * words, 4, pitch)
                .front()
          : col_views_in_place(fake_address(1), {{rows, cols / 32}}, cols / 32, cols / 32, cols / 32).front();
  const ColView views[] = {wv, sv};
  const ColPlan* plans[] = {&w, &s};
  const int32_t* offsets[] = {nullptr, nullptr};
  return gpu_col_launches(views, plans, offsets, 2, dev);
}

}  // namespace

// The launches apply.cpp makes for each op.
std::vector<Launch> launches_for(const std::string& op, const std::vector<int64_t>& dims,
                                 const DeviceSpec& dev) {
  if (op == "wq_b" && dims.size() == 3)  // rows, k, num_local_heads (fp8 weight, per-32 uint8 scale)
    return wq_b_launches(dims[0], dims[1], dims[2], 0, false, dev);
  if (op == "wq_b_packed" && dims.size() == 4)  // rows, k, num_local_heads, gran (MN-major int32 scale)
    return wq_b_launches(dims[0], dims[1], dims[2], dims[1] / (4 * dims[3]), true, dev);
  if (op == "wo_a" && dims.size() == 3)  // rows, cols, heads_per_group
    return wo_a_launches(1, dims[0], dims[1], dims[2], false, dev);
  if (op == "wv_packed" &&
      dims.size() == 4)  // n_groups, out, cols, heads_per_group (3-D, packed MN-major scale)
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
      "cols, heads_per_group) or 'permute_q' (tokens, heads, head_dim, element_size), got '" +
      op + "' with " + std::to_string(dims.size()) + " dims");
}

DeviceFields device_fields(const DeviceSpec& spec) {
  DeviceFields fields;
  for_each_field(spec, [&](const char* name, const auto& field) { fields[name] = field; });
  return fields;
}

DeviceFields device_fields(const DeviceFields& device) { return device_fields(device_spec(device)); }

#ifndef FLASHMLA_PERM_WITH_CUDA
// CPU builds (cuda/executor.cpp has the CUDA builds' forms).
DeviceFields cuda_device_fields(int) {
  throw std::runtime_error("flashmla_perm was built without CUDA kernels");
}
int cuda_resident_ctas_per_sm(const std::string&, int, int64_t, int) {
  throw std::runtime_error("flashmla_perm was built without CUDA kernels");
}
std::vector<LaunchInfo> cuda_driver_launches(const std::string&, const std::vector<int64_t>&, int) {
  throw std::runtime_error("flashmla_perm was built without CUDA kernels");
}
#endif

std::vector<LaunchInfo> gpu_launches(const std::string& op, const std::vector<int64_t>& dims,
                                     const DeviceFields& device) {
  for (int64_t d : dims)
    if (d <= 0) throw std::invalid_argument("gpu_launches: dims must be positive");
  std::vector<LaunchInfo> infos;
  for (const Launch& l : launches_for(op, dims, device_spec(device))) infos.push_back(launch_info(l));
  return infos;
}

}  // namespace flashmla_perm
