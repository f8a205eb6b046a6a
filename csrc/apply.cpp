#include "apply.h"

#include <atomic>

#include "executors.h"
#include "layout.h"

namespace flashmla_perm {
namespace {

std::atomic<int64_t> counts[3];

void served(Path path) { counts[static_cast<int>(path)].fetch_add(1, std::memory_order_relaxed); }

bool native_device(const at::Device& device) {
#ifdef FLASHMLA_PERM_WITH_CUDA
  if (device.is_cuda()) return true;
#endif
  return device.is_cpu();
}

at::Tensor perm_on(const std::vector<int64_t>& perm, const at::Device& device) {
  // Borrowed host memory: the gather below finishes before the plan can go.
  at::Tensor host = at::from_blob(const_cast<int64_t*>(perm.data()),
                                  {static_cast<int64_t>(perm.size())}, at::kLong);
  return device.is_cpu() ? host : host.to(device);
}

void aten_gather_(const at::Tensor& t, int64_t dim, const std::vector<int64_t>& perm) {
  at::Tensor bits = bits_view(t);
  bits.copy_(bits.index_select(dim, perm_on(perm, t.device())));
  served(Path::kAten);
}

ColView col_view(const at::Tensor& src, const at::Tensor& dst, const ColShape& s, const ColShape& d) {
  return ColView{static_cast<const uint8_t*>(src.data_ptr()), static_cast<uint8_t*>(dst.data_ptr()),
                 s.row_stride, d.row_stride, s.rows, s.row_bytes};
}

#ifdef FLASHMLA_PERM_WITH_CUDA
// An entry's index arrays on the device. Their first upload is a blocking
// copy, which a capturing stream cannot take: say so before anything moves.
at::Tensor arrays_on(const DeviceCopies& copies, const at::Device& device) {
  TORCH_CHECK(copies.has(device) || !cuda_capturing(device),
              "flashmla_perm: this permutation's plan is not on ", device,
              " yet, and the stream is capturing a CUDA graph; call the op once before "
              "capture (warm-up) so the plan is uploaded outside it");
  return copies.on(device);
}

// Runs launches that read `arrays` (an entry's device copies), keeping the
// entry alive for good if the stream is capturing a graph.
void run_cuda_entry(std::vector<Launch> launches, const at::Device& device,
                    std::vector<at::Tensor> arrays, const std::vector<std::shared_ptr<const void>>& entries) {
  if (cuda_capturing(device))
    for (const auto& e : entries) keep_for_graphs(e);
  run_cuda(std::move(launches), device, arrays);
  served(Path::kCuda);
}

void run_rows_cuda(const std::vector<UnitView>& views, const RowEntry& entry, const at::Device& device) {
  const RowPlan& plan = entry->plan;
  const at::Tensor arrays = arrays_on(entry->arrays, device);
  const int64_t* order = arrays.data_ptr<int64_t>();
  const int64_t* segments = order + plan.order.size();
  const DeviceSpec dev = cuda_device_spec(device);
  for (size_t i = 0; i < views.size(); i += kMaxJobs) {
    const int n = static_cast<int>(std::min<size_t>(kMaxJobs, views.size() - i));
    run_cuda_entry(gpu_row_launches(views.data() + i, n, plan, order, segments, dev), device, {arrays},
                   {entry});
  }
}

// Column gathers whose rows fit a tile buffer (or out of place), up to
// kMaxJobs in a launch.
void run_cols_cuda(const std::vector<std::pair<ColView, ColEntry>>& jobs, const at::Device& device) {
  const DeviceSpec dev = cuda_device_spec(device);
  for (size_t i = 0; i < jobs.size(); i += kMaxJobs) {
    const int n = static_cast<int>(std::min<size_t>(kMaxJobs, jobs.size() - i));
    ColView views[kMaxJobs];
    const ColPlan* plans[kMaxJobs];
    const int32_t* offsets[kMaxJobs];
    std::vector<at::Tensor> arrays;
    std::vector<std::shared_ptr<const void>> entries;
    for (int j = 0; j < n; ++j) {
      const auto& [view, entry] = jobs[i + j];
      arrays.push_back(arrays_on(entry->arrays, device));
      views[j] = view;
      plans[j] = &entry->plan;
      offsets[j] = arrays.back().data_ptr<int32_t>();
      entries.push_back(entry);
    }
    run_cuda_entry(gpu_col_launches(views, plans, offsets, n, dev), device, arrays, entries);
  }
}

// In place, rows too wide for a tile buffer: blocks of columns are units of
// a row plan, each one line per row.
void run_wide_cols_cuda(const at::Tensor& t, const ColShape& shape, const ColEntry& entry) {
  const RowPlanEntry& units = entry->units();
  const at::Device device = t.device();
  const at::Tensor arrays = arrays_on(units.arrays, device);
  const int64_t* order = arrays.data_ptr<int64_t>();
  const UnitView view = col_units(static_cast<uint8_t*>(t.data_ptr()), shape.rows, shape.row_stride,
                                  units.plan.unit_rows * t.element_size());
  run_cuda_entry(gpu_row_launches(&view, 1, units.plan, order, order + units.plan.order.size(),
                                  cuda_device_spec(device)),
                 device, {arrays}, {entry});
}
#endif

}  // namespace

int64_t path_count(Path path) { return counts[static_cast<int>(path)].load(); }

void apply_rows(const std::vector<at::Tensor>& tensors, const RowEntry& entry) {
  const RowPlan& plan = entry->plan;
  if (plan.num_segments == 0) return;
  std::vector<UnitView> views;
  at::Device device = at::kCPU;
  for (const at::Tensor& t : tensors) {
    if (t.numel() == 0) continue;
    const auto target = row_target(t);
    if (!target || !native_device(t.device())) {
      aten_gather_(t, 0, plan.perm);
      continue;
    }
    views.push_back(row_units(target->data, target->row_stride, target->row_bytes, plan.unit_rows));
    device = t.device();
  }
  if (views.empty()) return;
  if (device.is_cpu()) {
    for (const UnitView& v : views) run_rows_cpu(v, plan);
    served(Path::kCpu);
    return;
  }
#ifdef FLASHMLA_PERM_WITH_CUDA
  run_rows_cuda(views, entry, device);
#endif
}

void apply_cols(const std::vector<std::pair<at::Tensor, ColEntry>>& work) {
#ifdef FLASHMLA_PERM_WITH_CUDA
  std::vector<std::pair<ColView, ColEntry>> cuda_jobs;
  at::Device cuda_device = at::kCPU;
#endif
  for (const auto& [t, entry] : work) {
    if (t.numel() == 0 || entry->plan.identity) continue;
    const auto shape = col_shape(t);
    // Rows over 2^31 bytes have no gather map.
    if (!shape || entry->plan.source_offset.empty() || !native_device(t.device())) {
      aten_gather_(t, -1, entry->plan.perm);
      continue;
    }
    const ColView view = col_view(t, t, *shape, *shape);
    if (t.is_cpu()) {
      run_cols_cpu(view, entry->plan);
      served(Path::kCpu);
      continue;
    }
#ifdef FLASHMLA_PERM_WITH_CUDA
    if (gpu_cols_staged_fit(shape->row_bytes)) {
      cuda_jobs.emplace_back(view, entry);
      cuda_device = t.device();
    } else {
      run_wide_cols_cuda(t, *shape, entry);
    }
#endif
  }
#ifdef FLASHMLA_PERM_WITH_CUDA
  if (!cuda_jobs.empty()) run_cols_cuda(cuda_jobs, cuda_device);
#endif
}

at::Tensor applied_cols(const at::Tensor& src_in, const ColEntry& entry) {
  const at::Tensor src = col_shape(src_in) ? src_in : src_in.contiguous();
  at::Tensor out = at::empty(src.sizes(), src.options().memory_format(at::MemoryFormat::Contiguous));
  if (out.numel() == 0) return out;
  if (entry->plan.identity) return out.copy_(src);
  const ColView view = col_view(src, out, *col_shape(src), *col_shape(out));
  if (!entry->plan.source_offset.empty()) {
    if (src.is_cpu()) {
      run_cols_cpu(view, entry->plan);
      served(Path::kCpu);
      return out;
    }
#ifdef FLASHMLA_PERM_WITH_CUDA
    if (src.is_cuda()) {
      run_cols_cuda({{view, entry}}, src.device());
      return out;
    }
#endif
  }
  bits_view(out).copy_(bits_view(src).index_select(-1, perm_on(entry->plan.perm, src.device())));
  served(Path::kAten);
  return out;
}

}  // namespace flashmla_perm
