#include "apply.h"

#include <ATen/ops/arange.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/from_blob.h>

#include <algorithm>
#include <atomic>

#include "checks.h"
#include "executors.h"
#include "layout.h"

namespace flashmla_perm {
namespace {

std::atomic<int64_t> counts[3];

void served(Path path) { counts[static_cast<int>(path)].fetch_add(1, std::memory_order_relaxed); }

bool native_device(const at::Device& device) {
#ifdef FLASHMLA_PERM_WITH_CUDA
  if (device.is_cuda()) return cuda_device_spec(device).has_value();  // its kernels loaded
#endif
  return device.is_cpu();
}

at::Tensor perm_on(const std::vector<int64_t>& perm, const at::Device& device) {
  // Borrowed host memory: the gather below finishes before the plan can go.
  at::Tensor host =
      at::from_blob(const_cast<int64_t*>(perm.data()), {static_cast<int64_t>(perm.size())}, at::kLong);
  return device.is_cpu() ? host : host.to(device);
}

// Devices with no native kernels: the gather on the bit view.
// The plans keep no copy of perm: these slow paths read it back from a plan.
void aten_gather_(const at::Tensor& t, int64_t dim, const std::vector<int64_t>& perm) {
  at::Tensor bits = bits_view(t);
  bits.copy_(bits.index_select(dim, perm_on(perm, t.device())));
  served(Path::kAten);
}

// The same for int32 words of four packed bytes: unpacked, gathered, packed.
void aten_packed_gather_(const at::Tensor& t, const std::vector<int64_t>& byte_perm) {
  const at::Tensor shifts = at::arange(0, 32, 8, t.options().dtype(at::kLong));
  at::Tensor bytes = t.to(at::kLong).unsqueeze(-1).bitwise_right_shift(shifts).bitwise_and(0xFF);
  bytes = bytes.flatten(-2).index_select(-1, perm_on(byte_perm, t.device())).unflatten(-1, {t.size(-1), 4});
  at::Tensor words = bytes.bitwise_left_shift(shifts).sum(-1);  // [0, 2^32)
  words = words.sub(int64_t{1} << 32).where(words.ge(int64_t{1} << 31), words);  // as int32
  t.copy_(words.to(at::kInt));
  served(Path::kAten);
}

// Disjoint layouts the engines cannot take (interleaved dims: csrc/overlap.h
// accepts them, provably_disjoint does not): the engines permute a packed
// copy of the bits, copied back once the run is done.
struct Staged {
  at::Tensor t, packed;
};
at::Tensor engine_tensor(const at::Tensor& t, std::vector<Staged>& staged) {
  if (engine_layout(t)) return t;
  staged.push_back({t, bits_view(t).contiguous()});
  return staged.back().packed;
}
void copy_back(const std::vector<Staged>& staged) {
  for (const Staged& s : staged) bits_view(s.t).copy_(s.packed);
}

// One call's work on one device, gathered before anything moves.
struct RowWork {
  const RowPlanEntry* entry;
  std::shared_ptr<const void> owner;  // keeps `entry` alive
  std::vector<UnitView> views;
};
struct ColWork {
  ColView view;
  ColEntry entry;
};
struct Work {
  std::vector<RowWork> rows;
  std::vector<ColWork> cols;
};

std::vector<UnitView> units_of(const at::Tensor& t, int64_t dim, int64_t unit_rows) {
  return unit_views(bytes_of(t), dim_of(t, dim), unit_rows, dims_except(t, dim),
                    static_cast<int64_t>(t.element_size()));
}

void run_cpu(const Work& w) {
  // All the scratch and the tile buffers first: a failed allocation moves
  // nothing. The jobs run in turn, so one arena serves them all.
  std::vector<at::Tensor> scratch;
  int64_t arena_bytes = 0;
  for (const RowWork& r : w.rows)
    for (const UnitView& v : r.views) {
      scratch.push_back(at::empty({cpu_row_scratch_bytes(v, r.entry->plan)}, at::kByte));
      arena_bytes = std::max(arena_bytes, cpu_row_tile_bytes(v, r.entry->plan));
    }
  for (const ColWork& c : w.cols)
    arena_bytes = std::max(arena_bytes, cpu_col_tile_bytes(c.view, c.entry->plan));
  const at::Tensor arena_memory = at::empty({arena_bytes + 64}, at::kByte);
  uint8_t* arena = arena_memory.data_ptr<uint8_t>();
  arena += (64 - reinterpret_cast<uintptr_t>(arena) % 64) % 64;
  size_t s = 0;
  for (const RowWork& r : w.rows)
    for (const UnitView& v : r.views)
      run_rows_cpu(v, r.entry->plan, scratch[s++].data_ptr<uint8_t>(), arena, arena_bytes);
  for (const ColWork& c : w.cols) run_cols_cpu(c.view, c.entry->plan, arena, arena_bytes);
  served(Path::kCpu);
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

void run_gpu(const Work& w, const at::Device& device) {
  // Every device array first: a plan missing under capture raises before
  // any tensor of the call has moved.
  std::vector<at::Tensor> row_arrays, col_arrays;
  for (const RowWork& r : w.rows) row_arrays.push_back(arrays_on(r.entry->arrays, device));
  for (const ColWork& c : w.cols) col_arrays.push_back(arrays_on(c.entry->arrays, device));
  if (cuda_capturing(device)) {
    for (const RowWork& r : w.rows) keep_for_graphs(r.owner);
    for (const ColWork& c : w.cols) keep_for_graphs(c.entry);
  }
  // Every launch planned, then all of them run (run_cuda allocates all the
  // scratch before the first): nothing is left half-permuted.
  const DeviceSpec dev = *cuda_device_spec(device);
  std::vector<std::vector<Launch>> groups;
  std::vector<at::Tensor> arrays = row_arrays;
  arrays.insert(arrays.end(), col_arrays.begin(), col_arrays.end());
  for (size_t i = 0; i < w.rows.size(); ++i) {
    const RowPlan& plan = w.rows[i].entry->plan;
    const int32_t* index = row_arrays[i].data_ptr<int32_t>();
    const std::vector<UnitView>& views = w.rows[i].views;
    for (size_t k = 0; k < views.size(); k += kMaxJobs) {
      const int n = static_cast<int>(std::min<size_t>(kMaxJobs, views.size() - k));
      groups.push_back(gpu_row_launches(views.data() + k, n, plan, index, dev));
    }
  }
  for (size_t k = 0; k < w.cols.size(); k += kMaxJobs) {
    const int n = static_cast<int>(std::min<size_t>(kMaxJobs, w.cols.size() - k));
    ColView views[kMaxJobs];
    const ColPlan* plans[kMaxJobs];
    const int32_t* offsets[kMaxJobs];
    for (int j = 0; j < n; ++j) {
      views[j] = w.cols[k + j].view;
      plans[j] = &w.cols[k + j].entry->plan;
      offsets[j] = col_arrays[k + j].data_ptr<int32_t>();
    }
    groups.push_back(gpu_col_launches(views, plans, offsets, n, dev));
  }
  run_cuda(std::move(groups), device, arrays);
  served(Path::kCuda);
}
#endif

void run(const Work& w, const at::Device& device) {
  if (w.rows.empty() && w.cols.empty()) return;
  if (device.is_cpu()) return run_cpu(w);
#ifdef FLASHMLA_PERM_WITH_CUDA
  run_gpu(w, device);
#endif
}

}  // namespace

int64_t path_count(Path path) { return counts[static_cast<int>(path)].load(); }

void apply_rows(const std::vector<RowTarget>& targets, const RowEntry& entry) {
  if (entry->plan.num_segments == 0) return;
  std::vector<UnitView> views;
  std::vector<Staged> staged;
  at::Device device = at::kCPU;
  for (const auto& [t_in, dim] : targets) {
    if (t_in.numel() == 0) continue;
    if (!native_device(t_in.device())) {
      aten_gather_(t_in, dim, permutation_of(entry->plan));
      continue;
    }
    const at::Tensor t = engine_tensor(t_in, staged);
    const std::vector<UnitView> v = units_of(t, dim, entry->plan.unit_rows);
    views.insert(views.end(), v.begin(), v.end());
    device = t.device();
  }
  Work w;
  if (!views.empty()) w.rows.push_back({entry.get(), entry, std::move(views)});
  run(w, device);
  copy_back(staged);
}

ColForms forms_of(const ColEntry& entry) {
  // The row form lives in the entry: an aliasing pointer keeps the entry alive.
  return {[entry] { return entry; }, [entry] { return RowEntry(entry, &entry->units()); }};
}

namespace {

// Whether dim `dim` of t (stride 1 over elements) gathers within staged rows
// on t's device; views: the rows, when it does.
std::vector<ColView> gathered_rows(const at::Tensor& t, int64_t dim) {
  const Dim d = dim_of(t, dim);
  const int64_t es = static_cast<int64_t>(t.element_size());
  if (d.pitch != es || !col_map_fits(d.size, es)) return {};
  std::vector<ColView> views =
      col_views_in_place(bytes_of(t), dims_except(t, dim), d.size * es, d.size * es, d.size * es);
  const bool fits = t.is_cpu() ? cpu_cols_staged_fit(views.front()) : gpu_cols_staged_fit(views.front());
  return fits ? views : std::vector<ColView>{};
}

// Devices with no native kernels: the ATen gather, the values read back from a plan.
void aten_cols_(const ColTarget& c) {
  if (c.packed_words) {
    const ColEntry entry = c.plans.cols();
    if (!entry->plan.identity) aten_packed_gather_(c.t, permutation_of(entry->plan));
    return;
  }
  if (col_map_fits(c.t.size(c.dim), static_cast<int64_t>(c.t.element_size()))) {
    const ColEntry entry = c.plans.cols();
    if (!entry->plan.identity) aten_gather_(c.t, c.dim, permutation_of(entry->plan));
  } else {
    const RowEntry entry = c.plans.rows();
    if (entry->plan.num_segments > 0) aten_gather_(c.t, c.dim, permutation_of(entry->plan));
  }
}

}  // namespace

void apply_cols(const std::vector<ColTarget>& work, const char* op) {
  Work w;
  std::vector<Staged> staged;
  at::Device device = at::kCPU;
  for (const ColTarget& c : work) {
    if (c.t.numel() == 0) continue;
    if (!native_device(c.t.device())) {
      aten_cols_(c);
      continue;
    }
    const at::Tensor t = engine_tensor(c.t, staged);
    device = t.device();
    if (c.packed_words) {
      // A row is the 4 * W bytes of a row of words, words `pitch` apart.
      const Dim words = dim_of(t, -1);
      const int64_t row_bytes = 4 * words.size;
      const int64_t run = words.size == 1 || words.pitch == 4 ? row_bytes : 4;
      const std::vector<ColView> views =
          col_views_in_place(bytes_of(t), dims_except(t, -1), row_bytes, run, words.pitch);
      // Bytes cross words, so a row is staged whole: it must fit a tile buffer.
      TORCH_CHECK_VALUE(!t.is_cuda() || gpu_cols_staged_fit(views.front()), op, ": the packed scale's rows (",
                        words.size, " int32 words, ", row_bytes,
                        " bytes) are too wide for the CUDA kernels' ", kGpuTileBudget,
                        "-byte tile buffer (with a row's padding); permute this scale on the CPU");
      const ColEntry entry = c.plans.cols();
      if (entry->plan.identity) continue;
      for (const ColView& v : views) w.cols.push_back({v, entry});
      continue;
    }
    const std::vector<ColView> views = gathered_rows(t, c.dim);
    if (!views.empty()) {
      const ColEntry entry = c.plans.cols();
      if (entry->plan.identity) continue;
      for (const ColView& v : views) w.cols.push_back({v, entry});
    } else {
      // Any other stride, rows over 2^31 bytes, or rows too wide to stage
      // (a CPU thread's buffer, a GPU tile buffer): the permutation's row form.
      const RowEntry units = c.plans.rows();
      if (units->plan.num_segments == 0) continue;
      w.rows.push_back({units.get(), units, units_of(t, c.dim, units->plan.unit_rows)});
    }
  }
  run(w, device);
  copy_back(staged);
}

bool gather_narrow_cpu(const at::Tensor& self, int64_t dim, const at::Tensor& perm, const char* op) {
  // perm is read on every pass: one sharing self's bytes (a row of it, or
  // the same memory through another storage: from_numpy, frombuffer) would
  // be read after earlier passes wrote it. The plans read it once.
  if (!self.is_cpu() || !perm.is_cpu() || self.numel() == 0 || !engine_layout(self) ||
      overlap(byte_layout(perm), byte_layout(self)) != Overlap::kNo)
    return false;
  if (self.stride(dim) == 1 && !gathered_rows(self, dim).empty()) return false;  // the column engine's
  const std::vector<UnitView> views = units_of(self, dim, 1);
  for (const UnitView& v : views)
    if (!cpu_gathers(v)) return false;
  const at::Tensor values = perm.contiguous();
  const int64_t n = values.numel();
  // The buffer and a bit an index before any byte moves; perm is checked as
  // the first pass reads it, before that pass writes back.
  int64_t bytes = 0;
  for (const UnitView& v : views) bytes = std::max(bytes, cpu_gather_buffer_bytes(v, n));
  const at::Tensor buffer = at::empty({bytes}, at::kByte);
  std::vector<uint64_t> seen(static_cast<size_t>(cpu_gather_check_words(n)), 0);
  auto run = [&](const auto* p) {
    uint8_t* buf = buffer.data_ptr<uint8_t>();
    if (!run_gather_cpu(views.front(), p, n, buf, seen.data())) {
      check_perm_values(p, n, op);  // raises
      TORCH_INTERNAL_ASSERT(false, op, ": perm failed the gather's check but not the serial one");
    }
    for (size_t k = 1; k < views.size(); ++k) run_gather_cpu(views[k], p, n, buf, nullptr);
  };
  if (values.scalar_type() == at::kInt)
    run(values.data_ptr<int32_t>());
  else
    run(values.data_ptr<int64_t>());
  served(Path::kCpu);
  return true;
}

at::Tensor applied_cols(const at::Tensor& src_in, const ColForms& plans) {
  const bool rows_ok = src_in.size(-1) <= 1 || src_in.stride(-1) == 1;
  const at::Tensor src = rows_ok ? src_in : src_in.contiguous();
  at::Tensor out = at::empty(src.sizes(), src.options().memory_format(at::MemoryFormat::Contiguous));
  if (out.numel() == 0) return out;
  if (!col_map_fits(src.size(-1), static_cast<int64_t>(src.element_size()))) {
    out.copy_(src);  // rows over 2^31 bytes: a copy, then the row form in place
    apply_cols({{out, -1, plans}});
    return out;
  }
  const ColEntry entry = plans.cols();
  if (entry->plan.identity) return out.copy_(src);
  if (!native_device(src.device())) {
    bits_view(out).copy_(bits_view(src).index_select(-1, perm_on(permutation_of(entry->plan), src.device())));
    served(Path::kAten);
    return out;
  }
  const int64_t row_bytes = src.size(-1) * static_cast<int64_t>(src.element_size());
  Work w;
  for (const ColView& v : col_views_out(bytes_of(src), bytes_of(out), dims_except(src, -1), row_bytes))
    w.cols.push_back({v, entry});
  run(w, src.device());
  return out;
}

}  // namespace flashmla_perm
