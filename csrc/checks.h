// Argument checks shared by every op. Each failure names the op and the
// argument, raises ValueError or TypeError, and happens before any byte moves.
#pragma once

#include <ATen/core/Tensor.h>

namespace flashmla_perm {

// A tensor the op writes in place: defined, not requiring grad, not an
// inference tensor outside inference mode, no element reachable twice
// through its strides.
void check_writable(const at::Tensor& t, const char* op, const char* name);
// Defined, and dense (strided): every tensor argument.
void check_defined(const at::Tensor& t, const char* op, const char* name);
void check_dim(const at::Tensor& t, int64_t dim, const char* op, const char* name);
void check_positive(int64_t value, const char* op, const char* name);
// Same device, and no shared bytes (permuting one would corrupt the other).
void check_pair(const at::Tensor& a, const at::Tensor& b, const char* op, const char* name_a,
                const char* name_b);
// `perm` checked in two halves: what can be checked without reading its
// values (dtype, shape, device), and that its values are a permutation of
// [0, extent).
void check_perm_tensor(const at::Tensor& perm, int64_t extent, const at::Device& device, const char* op);
void check_perm_values(const int64_t* values, int64_t extent, const char* op);
void check_perm_values(const int32_t* values, int64_t extent, const char* op);

}  // namespace flashmla_perm
