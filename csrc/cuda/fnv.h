// FNV-1a, 64 bits: the kernels' source hash and the cache entries'
// checksum. It detects damage, not tampering: what keeps another user's
// bytes out of the cache is who may write its folder (kernel_cache.cpp).
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <string>

namespace flashmla_perm {
namespace cuda {

constexpr uint64_t kFnvStart = 14695981039346656037ull;

inline uint64_t fnv1a(uint64_t h, const char* data, size_t n) {
  for (size_t i = 0; i < n; ++i) h = (h ^ static_cast<unsigned char>(data[i])) * 1099511628211ull;
  return h;
}

inline std::string hex(uint64_t v) {
  char buf[17];
  std::snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(v));
  return buf;
}

}  // namespace cuda
}  // namespace flashmla_perm
