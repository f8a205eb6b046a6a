#include "apply.h"

#include <atomic>

#include "executors.h"
#include "layout.h"

namespace flashmla_perm {
namespace {

std::atomic<int64_t> counts[3];

void served(Path path) { counts[static_cast<int>(path)].fetch_add(1, std::memory_order_relaxed); }

at::Tensor perm_on(const std::vector<int64_t>& perm, const at::Device& device) {
  // Borrowed host memory: the gather below finishes before the plan can go.
  at::Tensor host = at::from_blob(const_cast<int64_t*>(perm.data()),
                                  {static_cast<int64_t>(perm.size())}, at::kLong);
  return device.is_cpu() ? host : host.to(device);
}

ColTarget col_target(const at::Tensor& src, const at::Tensor& dst, const ColShape& s,
                     const ColShape& d) {
  return ColTarget{static_cast<const uint8_t*>(src.data_ptr()), static_cast<uint8_t*>(dst.data_ptr()),
                   s.row_stride, d.row_stride, s.rows, s.row_bytes};
}

// Runs the native column executor for t's device; false where none applies.
bool run_cols_native(const ColTarget& target, const ColPlanEntry& entry, const at::Device& device) {
  if (entry.plan.source_offset.empty()) return false;  // rows too wide for a gather map
  if (device.is_cpu()) {
    run_cols_cpu(target, entry.plan);
    served(Path::kCpu);
    return true;
  }
#ifdef FLASHMLA_PERM_WITH_CUDA
  if (device.is_cuda() && cols_fit_cuda(target.row_bytes)) {
    const at::Tensor offsets = entry.arrays.on(device);
    run_cols_cuda(target, entry.plan, offsets.data_ptr<int32_t>(), device);
    served(Path::kCuda);
    return true;
  }
#endif
  return false;
}

}  // namespace

int64_t path_count(Path path) { return counts[static_cast<int>(path)].load(); }

void apply_rows(const at::Tensor& t, const RowPlanEntry& entry) {
  const RowPlan& plan = entry.plan;
  if (t.numel() == 0 || plan.num_segments == 0) return;
  if (const auto target = row_target(t)) {
    if (t.is_cpu()) {
      run_rows_cpu(*target, plan);
      served(Path::kCpu);
      return;
    }
#ifdef FLASHMLA_PERM_WITH_CUDA
    if (t.is_cuda()) {
      const at::Tensor arrays = entry.arrays.on(t.device());
      const int64_t* order = arrays.data_ptr<int64_t>();
      run_rows_cuda(*target, plan, order, order + plan.order.size(), t.device());
      served(Path::kCuda);
      return;
    }
#endif
  }
  at::Tensor bits = bits_view(t);
  bits.copy_(bits.index_select(0, perm_on(plan.perm, t.device())));
  served(Path::kAten);
}

void apply_cols(const at::Tensor& t, const ColPlanEntry& entry) {
  if (t.numel() == 0 || entry.plan.identity) return;
  if (const auto shape = col_shape(t)) {
    if (run_cols_native(col_target(t, t, *shape, *shape), entry, t.device())) return;
  }
  at::Tensor bits = bits_view(t);
  bits.copy_(bits.index_select(-1, perm_on(entry.plan.perm, t.device())));
  served(Path::kAten);
}

at::Tensor applied_cols(const at::Tensor& src_in, const ColPlanEntry& entry) {
  const at::Tensor src = col_shape(src_in) ? src_in : src_in.contiguous();
  at::Tensor out = at::empty(src.sizes(), src.options().memory_format(at::MemoryFormat::Contiguous));
  if (out.numel() == 0) return out;
  if (entry.plan.identity) return out.copy_(src);
  const ColShape s = *col_shape(src), d = *col_shape(out);
  if (run_cols_native(col_target(src, out, s, d), entry, src.device())) return out;
  bits_view(out).copy_(bits_view(src).index_select(-1, perm_on(entry.plan.perm, src.device())));
  served(Path::kAten);
  return out;
}

}  // namespace flashmla_perm
