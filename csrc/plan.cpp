#include "plan.h"

#include <cstdint>
#include <numeric>
#include <stdexcept>

namespace flashmla_perm {

void check_permutation(const int64_t* perm, int64_t n, const std::string& what) {
  std::vector<bool> seen(static_cast<size_t>(n), false);
  for (int64_t i = 0; i < n; ++i) {
    const int64_t v = perm[i];
    if (v < 0 || v >= n)
      throw std::invalid_argument(what + " is not a permutation: index " + std::to_string(v) +
                                  " at position " + std::to_string(i) + " is out of range [0, " +
                                  std::to_string(n) + ")");
    if (seen[v])
      throw std::invalid_argument(what + " is not a permutation: index " + std::to_string(v) +
                                  " appears more than once");
    seen[v] = true;
  }
}

int64_t block_size(const int64_t* perm, int64_t n) {
  int64_t g = n;
  for (int64_t i = 0; i < n && g > 1; ++i) {
    if (i == 0 || perm[i] != perm[i - 1] + 1) {  // a run of consecutive sources starts here
      g = std::gcd(g, i);
      g = std::gcd(g, perm[i]);
    }
  }
  return g < 1 ? 1 : g;
}

RowPlan make_row_plan(std::vector<int64_t> perm, int64_t max_segment) {
  return make_row_plan(std::make_shared<const std::vector<int64_t>>(std::move(perm)), max_segment);
}

RowPlan make_row_plan(SharedPerm shared, int64_t max_segment) {
  RowPlan plan;
  const std::vector<int64_t>& perm = *shared;
  const int64_t n = static_cast<int64_t>(perm.size());
  int64_t g = block_size(perm.data(), n);
  int64_t unit = 1;
  for (int64_t d = kMaxUnitRows; d >= 1; --d)
    if (g % d == 0) { unit = d; break; }
  plan.unit_rows = unit;

  // Walk the cycles of the unit permutation: destination c[k] <- source c[k+1].
  const int64_t units = n / unit;
  std::vector<bool> done(static_cast<size_t>(units), false);
  std::vector<int64_t> multi, single;  // segment triples, split by whether they need scratch
  std::vector<int64_t> multi_cycle_first;  // index in `multi` (in segments) of each cycle's first
  for (int64_t start = 0; start < units; ++start) {
    if (done[start]) continue;
    const int64_t first_pos = static_cast<int64_t>(plan.order.size());
    int64_t u = start;
    do {
      done[u] = true;
      plan.order.push_back(u);
      u = perm[u * unit] / unit;
    } while (u != start);
    const int64_t len = static_cast<int64_t>(plan.order.size()) - first_pos;
    if (len == 1) {  // fixed point: nothing moves
      plan.order.pop_back();
      continue;
    }
    if (len <= max_segment) {
      single.insert(single.end(), {first_pos, len, -1});
      continue;
    }
    // Cut into equal segments; each reads its last source from the slot of
    // the next segment (the cycle's first segment, for the last one).
    const int64_t nseg = (len + max_segment - 1) / max_segment;
    const int64_t first_slot = static_cast<int64_t>(multi.size()) / 3;
    int64_t pos = first_pos;
    for (int64_t s = 0; s < nseg; ++s) {
      const int64_t seg_len = len / nseg + (s < len % nseg ? 1 : 0);
      const int64_t next_slot = first_slot + (s + 1) % nseg;
      multi.insert(multi.end(), {pos, seg_len, next_slot});
      pos += seg_len;
    }
  }
  plan.num_scratch = static_cast<int64_t>(multi.size()) / 3;
  plan.segments = std::move(multi);
  plan.segments.insert(plan.segments.end(), single.begin(), single.end());
  plan.num_segments = static_cast<int64_t>(plan.segments.size()) / 3;
  plan.perm = std::move(shared);
  return plan;
}

ColPlan make_col_plan(std::vector<int64_t> perm, int64_t element_size) {
  return make_col_plan(std::make_shared<const std::vector<int64_t>>(std::move(perm)), element_size);
}

ColPlan make_col_plan(SharedPerm shared, int64_t element_size) {
  ColPlan plan;
  const std::vector<int64_t>& perm = *shared;
  const int64_t n = static_cast<int64_t>(perm.size());
  plan.identity = true;
  for (int64_t i = 0; i < n && plan.identity; ++i) plan.identity = perm[i] == i;
  // Chunk: the largest power of two <= kMaxChunk bytes dividing every run of
  // the permutation, so that each destination chunk has one contiguous source.
  const int64_t run_bytes = block_size(perm.data(), n) * element_size;
  int shift = 0;
  while ((int64_t{2} << shift) <= kMaxChunk && run_bytes % (int64_t{2} << shift) == 0) ++shift;
  plan.chunk_shift = shift;
  const int64_t chunk = int64_t{1} << shift;
  const int64_t row_bytes = n * element_size;
  plan.perm = shared;
  if (row_bytes > INT32_MAX) return plan;  // no gather map: such rows take the ATen path
  plan.source_offset.resize(static_cast<size_t>(row_bytes / chunk));
  const std::vector<int64_t>& p = perm;
  for (int64_t b = 0; b < row_bytes; b += chunk) {
    const int64_t e = b / element_size;
    plan.source_offset[b / chunk] =
        static_cast<int32_t>(p[e] * element_size + (b - e * element_size));
  }
  return plan;
}

std::vector<int64_t> q_fused_permutation(int64_t num_heads, int64_t head_dim) {
  // fused[(d / 16) * (H * 16) + h * 16 + d % 16] = standard[h * D + d]
  std::vector<int64_t> perm(static_cast<size_t>(num_heads * head_dim));
  for (int64_t h = 0; h < num_heads; ++h)
    for (int64_t d = 0; d < head_dim; ++d)
      perm[(d / 16) * (num_heads * 16) + h * 16 + d % 16] = h * head_dim + d;
  return perm;
}

std::vector<int64_t> o_fused_permutation(int64_t heads_per_group, int64_t head_dim) {
  // fused[(c * G + h) * 32 + j] = standard[h * D + c * 32 + j]
  std::vector<int64_t> perm(static_cast<size_t>(heads_per_group * head_dim));
  for (int64_t h = 0; h < heads_per_group; ++h)
    for (int64_t c = 0; c < head_dim / 32; ++c)
      for (int64_t j = 0; j < 32; ++j)
        perm[(c * heads_per_group + h) * 32 + j] = h * head_dim + c * 32 + j;
  return perm;
}

std::vector<int64_t> o_fused_chunk_permutation(int64_t heads_per_group, int64_t head_dim) {
  const std::vector<int64_t> full = o_fused_permutation(heads_per_group, head_dim);
  std::vector<int64_t> chunks(full.size() / 32);
  for (size_t i = 0; i < chunks.size(); ++i) chunks[i] = full[i * 32] / 32;
  return chunks;
}

std::vector<int64_t> inverse_permutation(const std::vector<int64_t>& perm) {
  std::vector<int64_t> inv(perm.size());
  for (size_t i = 0; i < perm.size(); ++i) inv[perm[i]] = static_cast<int64_t>(i);
  return inv;
}

}  // namespace flashmla_perm
