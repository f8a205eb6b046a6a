#include "checks.h"

#include <c10/core/GradMode.h>
#include <c10/core/InferenceMode.h>

#include <stdexcept>

#include "layout.h"
#include "plan.h"

namespace flashmla_perm {

void check_defined(const at::Tensor& t, const char* op, const char* name) {
  TORCH_CHECK_VALUE(t.defined(), op, ": ", name, " is an undefined tensor");
  // A sparse tensor has no bytes of its elements to move.
  TORCH_CHECK_VALUE(t.layout() == at::kStrided, op, ": ", name,
                    " must be a dense (strided) tensor, got layout ", t.layout());
}

void check_writable(const at::Tensor& t, const char* op, const char* name) {
  check_defined(t, op, name);
  TORCH_CHECK_VALUE(!(t.requires_grad() && c10::GradMode::is_enabled()), op, ": ", name,
                    " requires grad; permute weights under torch.no_grad() or on a detached tensor");
  // Torch refuses to write one outside inference mode, but only after its
  // kernel has (its version counter, which it has none of, is bumped last).
  TORCH_CHECK_VALUE(!t.is_inference() || c10::InferenceMode::is_enabled(), op, ": ", name,
                    " is an inference tensor (made under torch.inference_mode()), which cannot be written "
                    "in place outside inference mode; permute it under torch.inference_mode(), or a clone");
  // Every element is written in place, so no two may share a byte: the
  // exact rule (csrc/overlap.h), refusing also where its bounded search
  // gives up. Disjoint layouts the tile engines cannot take are permuted as
  // a packed copy (csrc/apply.cpp).
  TORCH_CHECK_VALUE(self_overlap(t) == Overlap::kNo, op, ": ", name,
                    " has overlapping memory (several elements share bytes, e.g. from expand), or "
                    "interleaved strides that cannot be proven apart; an in-place permutation "
                    "would corrupt it (permute a .contiguous() copy)");
}

void check_dim(const at::Tensor& t, int64_t dim, const char* op, const char* name) {
  TORCH_CHECK_VALUE(t.dim() == dim, op, ": ", name, " must be ", dim, "-D, got shape ", t.sizes());
}

void check_positive(int64_t value, const char* op, const char* name) {
  TORCH_CHECK_VALUE(value > 0, op, ": ", name, " must be positive, got ", value);
}

void check_pair(const at::Tensor& a, const at::Tensor& b, const char* op, const char* name_a,
                const char* name_b) {
  TORCH_CHECK_VALUE(a.device() == b.device(), op, ": ", name_b, " is on ", b.device(), " but ", name_a,
                    " is on ", a.device());
  // Meta tensors have no bytes; empty ones none to share. Otherwise the
  // exact rule on addresses: refused iff some byte belongs to both, or the
  // bounded search could not prove them apart.
  if (a.is_meta() || b.is_meta() || a.numel() == 0 || b.numel() == 0) return;
  const Overlap o = overlap(byte_layout(a), byte_layout(b));
  TORCH_CHECK_VALUE(o == Overlap::kNo, op, ": ", name_a, " and ", name_b,
                    o == Overlap::kYes ? " share memory"
                                       : " may share memory (their layouts could not be proven apart; "
                                         "permute .contiguous() copies)");
}

void check_perm_tensor(const at::Tensor& perm, int64_t extent, const at::Device& device, const char* op) {
  check_defined(perm, op, "perm");
  TORCH_CHECK_TYPE(perm.scalar_type() == at::kLong || perm.scalar_type() == at::kInt, op,
                   ": perm must be int64 or int32, got ", perm.scalar_type());
  TORCH_CHECK_VALUE(perm.dim() == 1, op, ": perm must be 1-D, got shape ", perm.sizes());
  TORCH_CHECK_VALUE(perm.numel() == extent, op, ": perm has ", perm.numel(),
                    " entries but the permuted dimension has ", extent);
  TORCH_CHECK_VALUE(perm.device().is_cpu() || perm.device() == device, op, ": perm is on ", perm.device(),
                    " but self is on ", device);
}

namespace {
template <class T>
void check_values(const T* values, int64_t extent, const char* op) {
  try {
    check_permutation(values, extent, std::string(op) + ": perm");
  } catch (const std::invalid_argument& e) {
    TORCH_CHECK_VALUE(false, e.what());
  }
}
}  // namespace

void check_perm_values(const int64_t* values, int64_t extent, const char* op) {
  check_values(values, extent, op);
}
void check_perm_values(const int32_t* values, int64_t extent, const char* op) {
  check_values(values, extent, op);
}

}  // namespace flashmla_perm
