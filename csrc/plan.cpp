#include "plan.h"

#include <algorithm>
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

namespace {

// Calls f(first unit, length) for each cycle of the unit permutation (fixed
// points left out), in order of first unit: destination c[k] <- source c[k+1].
template <class F>
void for_each_cycle(const int64_t* perm, int64_t unit, int64_t units, std::vector<bool>& done, F&& f) {
  done.assign(static_cast<size_t>(units), false);
  for (int64_t start = 0; start < units; ++start) {
    if (done[start]) continue;
    int64_t len = 0;
    int64_t u = start;
    do {
      done[u] = true;
      ++len;
      u = perm[u * unit] / unit;
    } while (u != start);
    if (len > 1) f(start, len);
  }
}

int64_t segments_of(int64_t len, int64_t max_segment) {
  return len <= max_segment ? 1 : (len + max_segment - 1) / max_segment;
}

}  // namespace

RowPlan make_row_plan(const std::vector<int64_t>& perm, int64_t max_segment, int64_t pack_above) {
  return make_row_plan(perm.data(), static_cast<int64_t>(perm.size()), max_segment, pack_above);
}

RowPlan make_row_plan(const int64_t* perm, int64_t n, int64_t max_segment, int64_t pack_above) {
  RowPlan plan;
  plan.size = n;
  const int64_t g = block_size(perm, n);
  int64_t unit = 1;
  for (int64_t d = kMaxUnitRows; d >= 1; --d)
    if (g % d == 0) { unit = d; break; }
  plan.unit_rows = unit;
  const int64_t units = n / unit;
  if (units > INT32_MAX)
    throw std::invalid_argument("a permuted dim of " + std::to_string(n) + " indices moves " +
                                std::to_string(units) + " units; the row engine takes at most 2^31 - 1");

  // Two walks over the cycles: the first sizes the array exactly (it is the
  // plan's only per-index memory: no vector growth, no second copy), the
  // second fills it. Cut cycles go first (their segments own the scratch
  // slots [0, num_scratch)), then the packed short cycles by length, then
  // whole cycles.
  if (max_segment < 1 || max_segment > kMaxSegment)  // a tile marks its cycles' ends in 64 bits
    throw std::invalid_argument("max_segment must be in [1, " + std::to_string(kMaxSegment) + "]");
  auto is_short = [&](int64_t len) { return 2 * len <= max_segment; };
  std::vector<int64_t> short_count(static_cast<size_t>(max_segment / 2 + 1), 0);
  std::vector<bool> done;
  int64_t cut_moved = 0, num_short = 0;
  for_each_cycle(perm, unit, units, done, [&](int64_t, int64_t len) {
    plan.moved += len;
    if (len > max_segment) {
      cut_moved += len;
      plan.num_scratch += segments_of(len, max_segment);
    } else if (is_short(len)) {
      ++short_count[len];
      ++num_short;
    } else {
      ++plan.num_segments;
    }
  });
  const bool pack = num_short > pack_above;
  // Packed: class c's cycles from pos_of[c], its segments from seg_of[c].
  std::vector<int64_t> pos_of(short_count.size(), 0), seg_of(short_count.size(), 0);
  int64_t packed_moved = 0;
  for (size_t c = 2; c < short_count.size() && pack; ++c) {
    pos_of[c] = cut_moved + packed_moved;
    seg_of[c] = plan.num_scratch + plan.num_packed;
    packed_moved += short_count[c] * static_cast<int64_t>(c);
    plan.num_packed += (short_count[c] + max_segment / c - 1) / (max_segment / c);
  }
  plan.num_segments += plan.num_scratch + (pack ? plan.num_packed : num_short);
  const int64_t words = plan.num_scratch + plan.num_packed;
  plan.index.assign(static_cast<size_t>(plan.moved + plan.num_segments + 1 + words), 0);
  int32_t* order = plan.index.data();
  int32_t* first = order + plan.moved;
  int32_t* word = first + plan.num_segments + 1;
  std::vector<int64_t> written(short_count.size(), 0);
  int64_t cut_pos = 0, whole_pos = cut_moved + packed_moved, cut_slot = 0, whole_slot = words;
  for_each_cycle(perm, unit, units, done, [&](int64_t start, int64_t len) {
    const bool packed = pack && is_short(len);
    int64_t& pos = len > max_segment ? cut_pos : packed ? pos_of[len] : whole_pos;
    const int64_t at = pos;
    for (int64_t k = 0, u = start; k < len; ++k, u = perm[u * unit] / unit) order[pos++] = static_cast<int32_t>(u);
    if (packed) {
      // A new segment every max_segment / len cycles of this length.
      if (written[len]++ % (max_segment / len) == 0) {
        first[seg_of[len]] = static_cast<int32_t>(at);
        word[seg_of[len]++] = static_cast<int32_t>(len);
      }
      return;
    }
    if (len <= max_segment) {
      first[whole_slot++] = static_cast<int32_t>(at);
      return;
    }
    // Cut into equal segments; each reads its last source from the slot of
    // the next segment (the cycle's first segment, for the last one).
    const int64_t nseg = segments_of(len, max_segment);
    const int64_t first_slot = cut_slot;
    int64_t seg_at = at;
    for (int64_t s = 0; s < nseg; ++s) {
      const int64_t seg_len = len / nseg + (s < len % nseg ? 1 : 0);
      first[cut_slot] = static_cast<int32_t>(seg_at);
      word[cut_slot++] = static_cast<int32_t>(first_slot + (s + 1) % nseg);
      seg_at += seg_len;
    }
  });
  first[plan.num_segments] = static_cast<int32_t>(plan.moved);
  return plan;
}

bool col_map_fits(int64_t n, int64_t element_size) { return n * element_size <= INT32_MAX; }

ColPlan make_col_plan(const std::vector<int64_t>& perm, int64_t element_size) {
  return make_col_plan(perm.data(), static_cast<int64_t>(perm.size()), element_size);
}

ColPlan make_col_plan(const int64_t* p, int64_t n, int64_t element_size) {
  if (!col_map_fits(n, element_size))
    throw std::invalid_argument("a row of " + std::to_string(n) + " elements of " + std::to_string(element_size) +
                                " bytes is over 2^31 bytes: no gather map (use the row plan)");
  ColPlan plan;
  plan.size = n;
  plan.element_size = element_size;
  plan.identity = true;
  for (int64_t i = 0; i < n && plan.identity; ++i) plan.identity = p[i] == i;
  // Chunk: the largest power of two <= kMaxChunk bytes dividing every run of
  // the permutation, so that each destination chunk has one contiguous source.
  const int64_t run_bytes = block_size(p, n) * element_size;
  int shift = 0;
  while ((int64_t{2} << shift) <= kMaxChunk && run_bytes % (int64_t{2} << shift) == 0) ++shift;
  plan.chunk_shift = shift;
  const int64_t chunk = int64_t{1} << shift;
  const int64_t row_bytes = n * element_size;
  plan.source_offset.resize(static_cast<size_t>(row_bytes / chunk));
  for (int64_t b = 0; b < row_bytes; b += chunk) {
    const int64_t e = b / element_size;
    plan.source_offset[b / chunk] = static_cast<int32_t>(p[e] * element_size + (b - e * element_size));
  }
  return plan;
}

namespace {

// Calls f(index, value) for every index of the permutation a plan applies.
template <class F>
void each_value(const RowPlan& plan, F&& f) {
  const int64_t unit = plan.unit_rows;
  const int32_t* order = plan.order();
  const int32_t* first = plan.first();
  // Fixed points first: indices outside every cycle map to themselves.
  std::vector<bool> moved(static_cast<size_t>(plan.size / unit), false);
  for (int64_t k = 0; k < plan.moved; ++k) moved[order[k]] = true;
  for (int64_t u = 0; u < plan.size / unit; ++u)
    if (!moved[u])
      for (int64_t r = 0; r < unit; ++r) f(u * unit + r, u * unit + r);
  // Destination order[k] <- source order[k + 1] inside a segment; its last
  // <- its own first (a whole cycle) or the next segment's first.
  // A packed segment's cycles of length c each wrap to their own first unit.
  for (int64_t s = 0; s < plan.num_segments; ++s) {
    const int32_t* pos = order + first[s];
    const int64_t len = plan.length(s), c = plan.cycle_length(s);
    for (int64_t k = 0; k < len; ++k) {
      const bool wraps = (k + 1) % c == 0;
      const int64_t src = !wraps ? pos[k + 1] : s < plan.num_scratch ? order[first[plan.word()[s]]] : pos[k + 1 - c];
      for (int64_t r = 0; r < unit; ++r) f(pos[k] * unit + r, src * unit + r);
    }
  }
}

template <class F>
void each_value(const ColPlan& plan, F&& f) {
  const int64_t es = plan.element_size;
  const int64_t mask = (int64_t{1} << plan.chunk_shift) - 1;
  for (int64_t e = 0; e < plan.size; ++e) {
    const int64_t b = e * es;  // an element's first byte: its chunk's source, plus its place in the chunk
    f(e, (plan.source_offset[b >> plan.chunk_shift] + (b & mask)) / es);
  }
}

template <class Plan>
std::vector<int64_t> values_of(const Plan& plan) {
  std::vector<int64_t> perm(static_cast<size_t>(plan.size));
  each_value(plan, [&](int64_t i, int64_t v) { perm[i] = v; });
  return perm;
}

template <class Plan>
bool same_values(const Plan& plan, const int64_t* perm, int64_t n) {
  if (n != plan.size) return false;
  bool same = true;
  each_value(plan, [&](int64_t i, int64_t v) { same = same && perm[i] == v; });
  return same;
}

}  // namespace

std::vector<int64_t> permutation_of(const RowPlan& plan) { return values_of(plan); }
std::vector<int64_t> permutation_of(const ColPlan& plan) { return values_of(plan); }
bool applies(const RowPlan& plan, const int64_t* perm, int64_t n) { return same_values(plan, perm, n); }
bool applies(const ColPlan& plan, const int64_t* perm, int64_t n) { return same_values(plan, perm, n); }

namespace {
// The layouts are only defined for these shapes; outside them the formulas
// would index past the end (the ops check first; gpu_launches relies on this).
void check_shape(bool ok, const char* what, int64_t heads, int64_t head_dim) {
  if (!ok)
    throw std::invalid_argument(std::string(what) + ": heads (" + std::to_string(heads) + ") must be positive and head_dim (" +
                                std::to_string(head_dim) + ") a positive multiple of the layout's block");
}
}  // namespace

std::vector<int64_t> q_fused_permutation(int64_t num_heads, int64_t head_dim) {
  check_shape(num_heads > 0 && head_dim > 0 && head_dim % 16 == 0, "q_fused_permutation", num_heads, head_dim);
  // fused[(d / 16) * (H * 16) + h * 16 + d % 16] = standard[h * D + d]
  std::vector<int64_t> perm(static_cast<size_t>(num_heads * head_dim));
  for (int64_t h = 0; h < num_heads; ++h)
    for (int64_t d = 0; d < head_dim; ++d)
      perm[(d / 16) * (num_heads * 16) + h * 16 + d % 16] = h * head_dim + d;
  return perm;
}

std::vector<int64_t> o_fused_permutation(int64_t heads_per_group, int64_t head_dim) {
  check_shape(heads_per_group > 0 && head_dim > 0 && head_dim % 32 == 0, "o_fused_permutation", heads_per_group,
              head_dim);
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
