// The op layer: schemas, argument checks, plans, dispatch. Every check runs
// before the first byte moves, so an error leaves every tensor as it was.
#include <torch/library.h>

#include "apply.h"
#include "checks.h"
#include "plan_cache.h"

namespace flashmla_perm {
namespace {

constexpr int64_t kQChunk = 16;
constexpr int64_t kOChunk = 32;

void check_permutable(const at::Tensor& self, const char* op) {
  TORCH_CHECK_VALUE(self.dim() >= 1, op, ": self must have at least 1 dimension, got a 0-D tensor");
}

// What both model ops ask of their arguments before their own shape rules.
void check_weight_and_scale(const at::Tensor& weight, const at::Tensor& weight_scale,
                            int64_t heads, const char* heads_name, const char* op) {
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
  TORCH_CHECK_VALUE(n % heads == 0, op, ": ", heads_name, " (", heads, ") must divide weight.size(",
                    dim, ") (", n, ")");
  const int64_t head_dim = n / heads;
  TORCH_CHECK_VALUE(head_dim % chunk == 0, op, ": head_dim = weight.size(", dim, ") / ", heads_name,
                    " = ", head_dim, " must be a multiple of ", chunk);
  return head_dim;
}

void permute_rows_(const at::Tensor& self, const at::Tensor& perm) {
  const char* op = "permute_rows_";
  check_writable(self, op, "self");
  check_permutable(self, op);
  std::vector<int64_t> values = host_permutation(perm, self.size(0), self.device(), op);
  apply_rows({self}, std::make_shared<const RowPlanEntry>(make_row_plan(std::move(values))));
}

void permute_cols_(const at::Tensor& self, const at::Tensor& perm) {
  const char* op = "permute_cols_";
  check_writable(self, op, "self");
  check_permutable(self, op);
  std::vector<int64_t> values = host_permutation(perm, self.size(-1), self.device(), op);
  apply_cols({{self, std::make_shared<const ColPlanEntry>(make_col_plan(std::move(values), self.element_size()))}});
}

at::Tensor permute_cols(const at::Tensor& self, const at::Tensor& perm) {
  const char* op = "permute_cols";
  check_defined(self, op, "self");
  check_permutable(self, op);
  std::vector<int64_t> values = host_permutation(perm, self.size(-1), self.device(), op);
  return applied_cols(self, std::make_shared<const ColPlanEntry>(make_col_plan(std::move(values), self.element_size())));
}

void permute_wq_b_(const at::Tensor& weight, const at::Tensor& weight_scale,
                   int64_t num_local_heads, bool inverse) {
  const char* op = "permute_wq_b_";
  check_weight_and_scale(weight, weight_scale, num_local_heads, "num_local_heads", op);
  const int64_t rows = weight.size(0);
  const int64_t head_dim = head_dim_of(weight, 0, num_local_heads, "num_local_heads", kQChunk, op);
  TORCH_CHECK_VALUE(weight_scale.size(0) == rows, op, ": weight_scale has ", weight_scale.size(0),
                    " rows but weight has ", rows);
  const auto entry = cached_q_row_plan(num_local_heads, head_dim, inverse);
  apply_rows({weight, weight_scale}, entry);  // one launch on CUDA
}

void permute_wo_a_(const at::Tensor& weight, const at::Tensor& weight_scale,
                   int64_t heads_per_group, bool inverse) {
  const char* op = "permute_wo_a_";
  check_weight_and_scale(weight, weight_scale, heads_per_group, "heads_per_group", op);
  const int64_t cols = weight.size(1);
  const int64_t head_dim = head_dim_of(weight, 1, heads_per_group, "heads_per_group", kOChunk, op);
  TORCH_CHECK_VALUE(weight_scale.size(0) == weight.size(0) && weight_scale.size(1) == cols / kOChunk,
                    op, ": weight_scale must have shape [", weight.size(0), ", ", cols / kOChunk,
                    "] (one scale per 32 columns of weight), got ", weight_scale.sizes());
  const auto w = cached_col_plan(ColKind::kO, heads_per_group, head_dim, weight.element_size(), inverse);
  const auto s = cached_col_plan(ColKind::kOChunk, heads_per_group, head_dim,
                                 weight_scale.element_size(), inverse);
  apply_cols({{weight, w}, {weight_scale, s}});  // one launch on CUDA
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
  return applied_cols(q.reshape({n, heads * head_dim}), entry).view({n, heads, head_dim});
}

}  // namespace

// Schemas, each beside what it does. The Python fallback (flashmla_perm/_schemas.py)
// registers the same strings; a test compares them.
TORCH_LIBRARY(flashmla_perm, m) {
  // self.copy_(self[perm]) in place: rows (dim 0) permuted.
  m.def("permute_rows_(Tensor(a!) self, Tensor perm) -> ()");
  // self.copy_(self[..., perm]) in place: last dim permuted.
  m.def("permute_cols_(Tensor(a!) self, Tensor perm) -> ()");
  // self[..., perm] as a new contiguous tensor.
  m.def("permute_cols(Tensor self, Tensor perm) -> Tensor");
  // Rows of a wq_b shard and its per-row scale, by the Q permutation (or its inverse).
  m.def("permute_wq_b_(Tensor(a!) weight, Tensor(b!) weight_scale, int num_local_heads, bool inverse=False) -> ()");
  // Columns of a wo_a shard by the O permutation, its per-32 scale by the O chunk permutation.
  m.def("permute_wo_a_(Tensor(a!) weight, Tensor(b!) weight_scale, int heads_per_group=8, bool inverse=False) -> ()");
  // [N, H, D] Q activations, standard <-> fused layout, as a new tensor.
  m.def("permute_q(Tensor q, bool inverse=False) -> Tensor");
}

// One kernel for every backend: the op layer picks the executor by device
// and takes the ATen path where none is built. Fake kernels come from Python.
TORCH_LIBRARY_IMPL(flashmla_perm, CompositeExplicitAutograd, m) {
  m.impl("permute_rows_", &permute_rows_);
  m.impl("permute_cols_", &permute_cols_);
  m.impl("permute_cols", &permute_cols);
  m.impl("permute_wq_b_", &permute_wq_b_);
  m.impl("permute_wo_a_", &permute_wo_a_);
  m.impl("permute_q", &permute_q);
}

}  // namespace flashmla_perm
