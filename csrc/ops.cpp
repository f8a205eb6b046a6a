// The op layer: schemas, argument checks, plans, dispatch. Every check runs
// before the first byte moves, so an error leaves every tensor as it was.
#include <ATen/core/LegacyTypeDispatch.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/zeros.h>
#include <torch/library.h>

#include <string>
#include <vector>

#include "apply.h"
#include "checks.h"
#include "perm_cache.h"
#include "plan_cache.h"

namespace flashmla_perm {
namespace {

constexpr int64_t kQChunk = 16;
constexpr int64_t kOChunk = 32;

void check_permutable(const at::Tensor& self, const char* op) {
  TORCH_CHECK_VALUE(self.dim() >= 1, op, ": self must have at least 1 dimension, got a 0-D tensor");
}

// What both model ops ask of their arguments before their own shape rules.
void check_weight_and_scale(const at::Tensor& weight, const at::Tensor& weight_scale, int64_t heads,
                            const char* heads_name, const char* op) {
  check_writable(weight, op, "weight");
  check_writable(weight_scale, op, "weight_scale");
  check_dim(weight, 2, op, "weight");
  check_dim(weight_scale, 2, op, "weight_scale");
  check_positive(heads, op, heads_name);
  check_pair(weight, weight_scale, op, "weight", "weight_scale");
}

// weight.size(dim) cut into `heads` heads; their head_dim, a multiple of `chunk`.
int64_t head_dim_of(const at::Tensor& weight, int64_t dim, int64_t heads, const char* heads_name,
                    int64_t chunk, const char* op) {
  const int64_t n = weight.size(dim);
  TORCH_CHECK_VALUE(n % heads == 0, op, ": ", heads_name, " (", heads, ") must divide weight.size(", dim,
                    ") (", n, ")");
  const int64_t head_dim = n / heads;
  TORCH_CHECK_VALUE(head_dim % chunk == 0, op, ": head_dim = weight.size(", dim, ") / ", heads_name, " = ",
                    head_dim, " must be a multiple of ", chunk);
  return head_dim;
}

int64_t align4(int64_t n) { return (n + 3) / 4 * 4; }

// a * b of two positive arguments, for a check against a size: where it
// overflows no size matches it, and the message says so instead of a wrapped number.
bool is_product(int64_t n, int64_t a, int64_t b) {
  int64_t p = 0;
  return !__builtin_mul_overflow(a, b, &p) && p == n;
}
std::string product_text(int64_t a, int64_t b) {
  int64_t p = 0;
  return __builtin_mul_overflow(a, b, &p) ? std::to_string(a) + " * " + std::to_string(b) + " (over 2^63)"
                                          : std::to_string(p);
}

// A caller's permutation's two forms for elements of `element_size` bytes.
ColForms forms_of(const CallPerm& call, int64_t element_size) {
  return {[call, element_size] { return call.cols(element_size); }, [call] { return call.rows(); }};
}

// self.copy_(self.index_select(dim, perm)) in place, any layout. A dim of
// stride 1 gathers within rows (the column engine); any other stride
// permutes sub-tensors (the row engine).
void permute_dim(const char* op, const at::Tensor& self, const at::Tensor& perm, int64_t dim) {
  check_writable(self, op, "self");
  check_permutable(self, op);
  const int64_t n = self.dim();
  TORCH_CHECK_VALUE(dim >= -n && dim < n, op, ": dim (", dim, ") is out of range for a ", n,
                    "-D self (expected ", -n, " to ", n - 1, ")");
  if (dim < 0) dim += n;
  check_perm_tensor(perm, self.size(dim), self.device(), op);
  if (gather_narrow_cpu(self, dim, perm, op)) return;
  const CallPerm call = prepared_permutation(perm, self.size(dim), self.device(), op);
  if (self.numel() == 0) return;
  if (self.stride(dim) == 1) {
    apply_cols({{self, dim, forms_of(call, self.element_size())}});
  } else {
    apply_rows({{self, dim}}, call.rows());
  }
}

void permute_(const at::Tensor& self, const at::Tensor& perm, int64_t dim) {
  permute_dim("permute_", self, perm, dim);
}

void permute_rows_(const at::Tensor& self, const at::Tensor& perm) {
  permute_dim("permute_rows_", self, perm, 0);
}

void permute_cols_(const at::Tensor& self, const at::Tensor& perm) {
  permute_dim("permute_cols_", self, perm, -1);
}

at::Tensor permute_cols(const at::Tensor& self, const at::Tensor& perm) {
  const char* op = "permute_cols";
  check_defined(self, op, "self");
  check_permutable(self, op);
  const CallPerm call = prepared_permutation(perm, self.size(-1), self.device(), op);
  return applied_cols(self, forms_of(call, self.element_size()));
}

// wq_b's checks; returns head_dim.
int64_t check_wq_b(const at::Tensor& weight, const at::Tensor& weight_scale, int64_t num_local_heads,
                   const char* op) {
  check_weight_and_scale(weight, weight_scale, num_local_heads, "num_local_heads", op);
  const int64_t head_dim = head_dim_of(weight, 0, num_local_heads, "num_local_heads", kQChunk, op);
  TORCH_CHECK_VALUE(weight_scale.size(0) == weight.size(0), op, ": weight_scale has ", weight_scale.size(0),
                    " rows but weight has ", weight.size(0));
  return head_dim;
}

void permute_wq_b_(const at::Tensor& weight, const at::Tensor& weight_scale, int64_t num_local_heads,
                   bool inverse) {
  const int64_t head_dim = check_wq_b(weight, weight_scale, num_local_heads, "permute_wq_b_");
  if (head_dim == 0) return;  // no rows: nothing moves (the reference's answer too)
  const auto entry = cached_q_row_plan(num_local_heads, head_dim, inverse);
  apply_rows({{weight, 0}, {weight_scale, 0}}, entry);  // any layouts; one launch on CUDA
}

// wo_a's checks (weight 2-D or 3-D); returns whether the scale is packed
// int32 words (four per-32 scales each) rather than one element per 32 columns.
bool check_wo_a(const at::Tensor& weight, const at::Tensor& weight_scale, int64_t heads_per_group,
                const char* op) {
  check_writable(weight, op, "weight");
  check_writable(weight_scale, op, "weight_scale");
  TORCH_CHECK_VALUE(weight.dim() == 2 || weight.dim() == 3, op, ": weight must be 2-D or 3-D, got shape ",
                    weight.sizes());
  TORCH_CHECK_VALUE(weight_scale.dim() == weight.dim(), op, ": weight_scale must be ", weight.dim(),
                    "-D like weight, got shape ", weight_scale.sizes());
  check_positive(heads_per_group, op, "heads_per_group");
  check_pair(weight, weight_scale, op, "weight", "weight_scale");
  const int64_t cols = weight.size(-1);
  head_dim_of(weight, weight.dim() - 1, heads_per_group, "heads_per_group", kOChunk, op);
  const auto lead = weight.sizes().slice(0, weight.dim() - 1);
  const bool same_lead = weight_scale.sizes().slice(0, weight.dim() - 1) == lead;
  const int64_t last = weight_scale.size(-1);
  const bool packed = same_lead && weight_scale.scalar_type() == at::kInt && cols > 0 &&
                      cols % (4 * kOChunk) == 0 && last == cols / (4 * kOChunk);
  std::vector<int64_t> per_32(lead.begin(), lead.end()), per_word(per_32);
  per_32.push_back(cols / kOChunk);
  per_word.push_back(cols / (4 * kOChunk));
  TORCH_CHECK_VALUE(packed || (same_lead && last == cols / kOChunk), op, ": weight_scale must have shape ",
                    at::IntArrayRef(per_32), " (one scale per 32 columns of weight) or, int32, ",
                    at::IntArrayRef(per_word), " (four packed scales per word), got ", weight_scale.sizes());
  return packed;
}

// wo_a's columns and its scale's, in place, once checked (permute_wo_a_ and
// the permute_wv_proj drop-in): one launch on CUDA.
void wo_a_in_place(const at::Tensor& weight, const at::Tensor& weight_scale, int64_t heads_per_group,
                   bool packed, bool inverse, const char* op) {
  const int64_t head_dim = weight.size(-1) / heads_per_group;
  const auto w = cached_col_plan(ColKind::kO, heads_per_group, head_dim, weight.element_size(), inverse);
  // Packed: the plan moves the bytes of each row of words.
  const auto s = cached_col_plan(ColKind::kOChunk, heads_per_group, head_dim,
                                 packed ? 1 : weight_scale.element_size(), inverse);
  apply_cols({{weight, -1, forms_of(w)}, {weight_scale, -1, forms_of(s), packed}}, op);
}

void permute_wo_a_(const at::Tensor& weight, const at::Tensor& weight_scale, int64_t heads_per_group,
                   bool inverse) {
  const char* op = "permute_wo_a_";
  const bool packed = check_wo_a(weight, weight_scale, heads_per_group, op);
  if (weight.size(-1) == 0) return;  // no columns: nothing moves (the reference's answer too)
  wo_a_in_place(weight, weight_scale, heads_per_group, packed, inverse, op);
}

at::Tensor permute_q(const at::Tensor& q, bool inverse) {
  const char* op = "permute_q";
  check_defined(q, op, "q");
  check_dim(q, 3, op, "q");
  const int64_t n = q.size(0), heads = q.size(1), head_dim = q.size(2);
  TORCH_CHECK_VALUE(head_dim % kQChunk == 0, op, ": head_dim = q.size(2) = ", head_dim,
                    " must be a multiple of ", kQChunk);
  if (q.numel() == 0) return at::empty(q.sizes(), q.options());
  const auto entry = cached_col_plan(ColKind::kQ, heads, head_dim, q.element_size(), inverse);
  return applied_cols(q.reshape({n, heads * head_dim}), forms_of(entry)).view({n, heads, head_dim});
}

// FlashMLA's drop-ins: its checks (csrc/api/fused_norm_rope_attn_rope_cast_fwd.cpp:
// what it accepts, these accept, on any device; plus head_dim a multiple of the
// chunk, which its permutations need), then a copy into the output layout and
// the in-place ops on it.
std::pair<at::Tensor, at::Tensor> unpack_pair(at::TensorList weight_and_scale, const char* op) {
  TORCH_CHECK_VALUE(weight_and_scale.size() == 2, op, ": weight_and_scale must be (weight, scale), got ",
                    weight_and_scale.size(), " tensors");
  const at::Tensor& weight = weight_and_scale[0];
  const at::Tensor& scale = weight_and_scale[1];
  check_defined(weight, op, "weight");
  check_defined(scale, op, "scale");
  return {weight, scale};
}

void check_fp8_weight(const at::Tensor& weight, int64_t dim, const char* op) {
  check_dim(weight, dim, op, "weight");
  TORCH_CHECK_TYPE(weight.scalar_type() == at::kFloat8_e4m3fn, op, ": weight must be float8_e4m3fn, got ",
                   weight.scalar_type());
}

void check_same_device(const at::Tensor& a, const at::Tensor& b, const char* op, const char* name_a,
                       const char* name_b) {
  TORCH_CHECK_VALUE(a.device() == b.device(), op, ": ", name_b, " is on ", b.device(), " but ", name_a,
                    " is on ", a.device());
}

void check_packed_scale_dtype(const at::Tensor& scale, const char* op) {
  TORCH_CHECK_TYPE(scale.scalar_type() == at::kInt, op, ": scale must be int32 (packed ue8m0), got ",
                   scale.scalar_type());
}

// The drop-ins' common checks: (weight, scale), an fp8 weight of `rank`
// dims, `heads` heads of `head_dim` (a multiple of `chunk`).
std::pair<at::Tensor, at::Tensor> drop_in_inputs(at::TensorList weight_and_scale, int64_t rank, int64_t heads,
                                                 const char* heads_name, int64_t head_dim,
                                                 const char* head_dim_name, int64_t chunk, const char* op) {
  auto pair = unpack_pair(weight_and_scale, op);
  check_fp8_weight(pair.first, rank, op);
  // FlashMLA reads weight rows at any pitch, elements packed.
  TORCH_CHECK_VALUE(pair.first.size(-1) == 1 || pair.first.stride(-1) == 1, op,
                    ": weight must have a contiguous last dimension (stride(-1) == 1), got strides ",
                    pair.first.strides());
  check_positive(heads, op, heads_name);
  check_positive(head_dim, op, head_dim_name);
  TORCH_CHECK_VALUE(head_dim % chunk == 0, op, ": ", head_dim_name, " (", head_dim,
                    ") must be a multiple of ", chunk);
  return pair;
}

std::vector<at::Tensor> permute_q_b_proj(at::TensorList weight_and_scale, int64_t h_q, int64_t d_q) {
  const char* op = "permute_q_b_proj";
  const auto [weight, scale] = drop_in_inputs(weight_and_scale, 2, h_q, "h_q", d_q, "d_q", kQChunk, op);
  const int64_t rows = weight.size(0), k = weight.size(1);
  TORCH_CHECK_VALUE(is_product(rows, h_q, d_q), op, ": weight has ", rows,
                    " rows but h_q * d_q = ", product_text(h_q, d_q));
  check_packed_scale_dtype(scale, op);
  check_dim(scale, 2, op, "scale");
  TORCH_CHECK_VALUE(scale.size(0) == rows, op, ": scale has ", scale.size(0), " rows but weight has ", rows);
  const int64_t words = scale.size(1);
  const bool divides = words > 0 && k % (4 * words) == 0;
  const int64_t gran = divides ? k / (4 * words) : 0;
  TORCH_CHECK_VALUE(divides, op, ": scale has ", words,
                    " words per row, so gran = K / (4 * W) must be 32 or 128 (K = ", k, ")");
  TORCH_CHECK_VALUE(gran == 32 || gran == 128, op, ": scale has ", words,
                    " words per row, so gran = K / (4 * W) = ", gran, " must be 32 or 128 (K = ", k, ")");
  // FlashMLA checks stride(0) alone and reads words at scale.stride(1): any
  // padding of the rows is valid input.
  TORCH_CHECK_VALUE(scale.stride(0) == 1, op, ": scale must be MN-major (stride(0) == 1), got strides ",
                    scale.strides());
  check_same_device(weight, scale, op, "weight", "scale");  // inputs are only read: they may share memory
  const int64_t a = align4(rows);
  at::Tensor w = weight.clone(at::MemoryFormat::Contiguous);
  at::Tensor s = at::zeros({words, a}, scale.options()).t().narrow(0, 0, rows);
  s.copy_(scale);
  apply_rows({{w, 0}, {s, 0}}, cached_q_row_plan(h_q, d_q, false));
  return {w, s};
}

std::vector<at::Tensor> permute_wv_proj(at::TensorList weight_and_scale, int64_t wv_group_size, int64_t d_o) {
  const char* op = "permute_wv_proj";
  const auto [weight, scale] =
      drop_in_inputs(weight_and_scale, 3, wv_group_size, "wv_group_size", d_o, "d_o", kOChunk, op);
  TORCH_CHECK_VALUE(is_product(weight.size(2), wv_group_size, d_o), op, ": weight.size(2) (", weight.size(2),
                    ") must be wv_group_size * d_o = ", product_text(wv_group_size, d_o));
  const int64_t cols = weight.size(2);
  TORCH_CHECK_VALUE(cols % (4 * kOChunk) == 0, op, ": wv_group_size * d_o (", cols,
                    ") must be a multiple of ", 4 * kOChunk);
  check_packed_scale_dtype(scale, op);
  check_dim(scale, 3, op, "scale");
  const int64_t groups = weight.size(0), out = weight.size(1), words = cols / (4 * kOChunk);
  TORCH_CHECK_VALUE(scale.sizes() == at::IntArrayRef({groups, out, words}), op, ": scale must have shape [",
                    groups, ", ", out, ", ", words, "], got ", scale.sizes());
  TORCH_CHECK_VALUE(scale.stride(1) == 1, op, ": scale must be MN-major (stride(1) == 1), got strides ",
                    scale.strides());
  check_same_device(weight, scale, op, "weight", "scale");
  at::Tensor w = weight.clone(at::MemoryFormat::Contiguous);
  at::Tensor s = at::zeros({groups, words, align4(out)}, scale.options()).transpose(1, 2).narrow(1, 0, out);
  s.copy_(scale);
  wo_a_in_place(w, s, wv_group_size, /*packed=*/true, /*inverse=*/false, op);
  return {w, s};
}

// The in-place ops count their writes as torch's own do: after the op, each
// tensor it wrote (a `Tensor(a!)` argument) has its version counter one up,
// so autograd refuses a backward through a tensor saved before it was
// permuted, and a device perm permuted in place is not found again in the
// plan cache (csrc/perm_cache.cpp finds one by its version). One boxed
// kernel for every op, at the dispatch key torch bumps versions at (inside
// inference mode too). An inference tensor has no counter to bump (and
// check_writable refuses one outside inference mode). An op that raises
// wrote nothing and counts nothing.
void count_writes(const c10::OperatorHandle& op, c10::DispatchKeySet keys, torch::jit::Stack* stack) {
  const auto& args = op.schema().arguments();
  const size_t first = stack->size() - args.size();
  std::vector<at::Tensor> written;
  for (size_t i = 0; i < args.size(); ++i)
    if (args[i].alias_info() != nullptr && args[i].alias_info()->isWrite())
      written.push_back((*stack)[first + i].toTensor());
  {
    at::AutoDispatchBelowADInplaceOrView guard;
    op.redispatchBoxed(keys & c10::after_ADInplaceOrView_keyset, stack);
  }
  for (const at::Tensor& t : written) t.unsafeGetTensorImpl()->bump_version();
}

}  // namespace

// Schemas, each beside what it does. The Python fallback (flashmla_perm/_schemas.py)
// registers the same strings; a test compares them.
TORCH_LIBRARY(flashmla_perm, m) {
  // self.copy_(self.index_select(dim, perm)) in place, any dim of any layout.
  m.def("permute_(Tensor(a!) self, Tensor perm, int dim=0) -> ()");
  // self.copy_(self[perm]) in place: rows (dim 0) permuted.
  m.def("permute_rows_(Tensor(a!) self, Tensor perm) -> ()");
  // self.copy_(self[..., perm]) in place: last dim permuted.
  m.def("permute_cols_(Tensor(a!) self, Tensor perm) -> ()");
  // self[..., perm] as a new contiguous tensor.
  m.def("permute_cols(Tensor self, Tensor perm) -> Tensor");
  // Rows of a wq_b shard and its per-row scale, by the Q permutation (or its inverse).
  m.def(
      "permute_wq_b_(Tensor(a!) weight, Tensor(b!) weight_scale, int num_local_heads, bool inverse=False) -> "
      "()");
  // Columns of a wo_a shard by the O permutation, its per-32 scale by the O chunk permutation.
  m.def(
      "permute_wo_a_(Tensor(a!) weight, Tensor(b!) weight_scale, int heads_per_group=8, bool inverse=False) "
      "-> ()");
  // [N, H, D] Q activations, standard <-> fused layout, as a new tensor.
  m.def("permute_q(Tensor q, bool inverse=False) -> Tensor");
  // FlashMLA's ops, out of place, on every device: (weight, packed MN-major scale).
  m.def("permute_q_b_proj(Tensor[] weight_and_scale, int h_q, int d_q) -> Tensor[]");
  m.def("permute_wv_proj(Tensor[] weight_and_scale, int wv_group_size, int d_o) -> Tensor[]");
}

// One kernel for every backend: the op layer picks the executor by device
// and takes the ATen path where none is built. Fake kernels come from Python.
TORCH_LIBRARY_IMPL(flashmla_perm, CompositeExplicitAutograd, m) {
  m.impl("permute_", &permute_);
  m.impl("permute_rows_", &permute_rows_);
  m.impl("permute_cols_", &permute_cols_);
  m.impl("permute_cols", &permute_cols);
  m.impl("permute_wq_b_", &permute_wq_b_);
  m.impl("permute_wo_a_", &permute_wo_a_);
  m.impl("permute_q", &permute_q);
  m.impl("permute_q_b_proj", &permute_q_b_proj);
  m.impl("permute_wv_proj", &permute_wv_proj);
}

TORCH_LIBRARY_IMPL(flashmla_perm, ADInplaceOrView, m) {
  for (const char* name : {"permute_", "permute_rows_", "permute_cols_", "permute_wq_b_", "permute_wo_a_"})
    m.impl(name, torch::CppFunction::makeFromBoxedFunction<&count_writes>());
}

}  // namespace flashmla_perm
