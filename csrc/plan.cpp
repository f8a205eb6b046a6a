#include "plan.h"

#include <algorithm>
#include <cstdint>
#include <numeric>
#include <stdexcept>
#include <thread>

namespace flashmla_perm {

namespace {

template <class T>
void check_values(const T* perm, int64_t n, const std::string& what) {
  // A bit an index, in words (vector<bool> took twice as long).
  std::vector<uint64_t> seen(static_cast<size_t>((n + 63) / 64), 0);
  for (int64_t i = 0; i < n; ++i) {
    const int64_t v = perm[i];
    if (v < 0 || v >= n)
      throw std::invalid_argument(what + " is not a permutation: index " + std::to_string(v) +
                                  " at position " + std::to_string(i) + " is out of range [0, " +
                                  std::to_string(n) + ")");
    const uint64_t bit = uint64_t{1} << (v & 63);
    if (seen[v >> 6] & bit)
      throw std::invalid_argument(what + " is not a permutation: index " + std::to_string(v) +
                                  " appears more than once");
    seen[v >> 6] |= bit;
  }
}

}  // namespace

void check_permutation(const int64_t* perm, int64_t n, const std::string& what) {
  check_values(perm, n, what);
}
void check_permutation(const int32_t* perm, int64_t n, const std::string& what) {
  check_values(perm, n, what);
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

int64_t segments_of(int64_t len, int64_t max_segment) {
  return len <= max_segment ? 1 : (len + max_segment - 1) / max_segment;
}

// Unit u's source unit: perm[u * unit] / unit (unit 1: no divide).
template <bool kOne>
struct Successor {
  const int64_t* perm;
  int64_t unit;
  const int64_t* at(int64_t u) const { return kOne ? perm + u : perm + u * unit; }
  int64_t operator()(int64_t u) const { return kOne ? perm[u] : perm[u * unit] / unit; }
};

// One bit per unit.
struct Bits {
  std::vector<uint64_t> words;
  explicit Bits(int64_t n) : words(static_cast<size_t>((n + 63) / 64), 0) {}
  bool get(int64_t u) const { return (words[u >> 6] >> (u & 63)) & 1; }
  void set(int64_t u) { words[u >> 6] |= uint64_t{1} << (u & 63); }
};

inline void prefetch(const void* p) { __builtin_prefetch(p, 0, 0); }

// A walk along one cycle: where it is, where it started, what it carries.
struct Walker {
  int64_t cur, start, len, slot;
  int32_t held[kMaxSegment];  // units walked, where a walk keeps them
};

// Walks along cycles, up to kWalkers of them at once in one thread: each
// round takes one step of every walker, whose loads are independent, and
// prefetches each walker's next load a round ahead, so that many misses are
// in flight where one walk would wait on each in turn (a random permutation
// puts most of its units in one cycle: walked alone, at memory latency).
// start(w) sets up the next walk (false: none left); step(w, v), with v the
// source of w.cur, moves on (w.cur = v: true) or ends the walk (false).
constexpr int kWalkers = 32;
template <class Succ, class Start, class Step>
void walk_interleaved(const Succ& succ, Start&& start, Step&& step) {
  Walker w[kWalkers];
  int active = 0;
  while (active < kWalkers && start(w[active])) prefetch(succ.at(w[active++].cur));
  while (active > 0) {
    for (int i = 0; i < active;) {
      Walker& k = w[i];
      const int64_t v = succ(k.cur);
      if (step(k, v)) {
        k.cur = v;
      } else if (!start(k)) {
        k = w[--active];  // the last walker takes this slot (its step waits a round)
        continue;
      }
      prefetch(succ.at(k.cur));
      ++i;
    }
  }
}

// Where each cycle's units go in the plan's array, and its segments' words.
struct Layout {
  RowPlan& plan;
  int64_t max_segment;
  bool pack = false;
  std::vector<int64_t> pos_of, seg_of, written;  // packed cycles, by length
  int64_t cut_pos = 0, whole_pos = 0, cut_slot = 0, whole_slot = 0;
  int32_t *order = nullptr, *first = nullptr, *word = nullptr;
  bool is_short(int64_t len) const { return 2 * len <= max_segment; }

  // Counts: call for every cycle, then allocate().
  int64_t cut_moved = 0, num_short = 0;
  std::vector<int64_t> short_count;
  Layout(RowPlan& p, int64_t ms)
      : plan(p), max_segment(ms), short_count(static_cast<size_t>(ms / 2 + 1), 0) {}
  void count(int64_t len) {
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
  }

  // Sizes the array exactly (it is the plan's only per-index memory: no
  // vector growth, no second copy). Cut cycles go first (their segments own
  // the scratch slots [0, num_scratch)), then the packed short cycles by
  // length, then whole cycles.
  void allocate(int64_t pack_above) {
    pack = num_short > pack_above;
    pos_of.assign(short_count.size(), 0);
    seg_of.assign(short_count.size(), 0);
    written.assign(short_count.size(), 0);
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
    order = plan.index.data();
    first = order + plan.moved;
    word = first + plan.num_segments + 1;
    whole_pos = cut_moved + packed_moved;
    whole_slot = words;
    first[plan.num_segments] = static_cast<int32_t>(plan.moved);
  }

  // A cycle of len units: its first position in order[], its segments set.
  int64_t place(int64_t len) {
    const bool packed = pack && is_short(len);
    int64_t& pos = len > max_segment ? cut_pos : packed ? pos_of[len] : whole_pos;
    const int64_t at = pos;
    pos += len;
    if (packed) {
      // A new segment every max_segment / len cycles of this length.
      if (written[len]++ % (max_segment / len) == 0) {
        first[seg_of[len]] = static_cast<int32_t>(at);
        word[seg_of[len]++] = static_cast<int32_t>(len);
      }
      return at;
    }
    if (len <= max_segment) {
      first[whole_slot++] = static_cast<int32_t>(at);
      return at;
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
    return at;
  }
};

// Landmarks: units 0, L, 2L, ... (L a power of two, at least 64), at most
// kMaxLandmarks of them (what they keep stays within 128 KiB).
constexpr int64_t kMaxLandmarks = 16 * 1024;

// The cycles, in two kinds of walks:
// 1. From every landmark to the next landmark on its cycle: the walk's
//    length and where it ends, every unit walked marked. Cycles through a
//    landmark are then chains of walks, followed in the landmarks' records.
// 2. The cycles through no landmark, from each unit not marked yet in
//    increasing order: a walk that meets a smaller unit stops (its start is
//    not its cycle's least unit), one that comes back to its start counts
//    its cycle, having marked every unit of it but that start.
// Then the array is sized, each cycle placed, and both kinds walked again
// to write their units (the second kind from the unmarked starts).
// Walks that end where another begins (a landmark) or at a smaller unit
// are what lets many run at once; each unit is walked about twice in all.
// Units from which a second thread writes half the landmark walks (below,
// starting it costs more than it saves).
constexpr int64_t kThreadedUnits = 256 * 1024;

template <class Succ>
void build_row_plan(RowPlan& plan, const Succ& succ, int64_t units, int64_t max_segment, int64_t pack_above,
                    int threads) {
  int shift = 6;
  while ((units >> shift) >= kMaxLandmarks) ++shift;
  const int64_t mask = (int64_t{1} << shift) - 1;
  const int64_t landmarks = (units + mask) >> shift;
  auto landmark = [&](int64_t u) { return (u & mask) == 0; };
  Bits marked(units);

  // 1. Landmark walks: length (then its place in order[]) and the next landmark.
  std::vector<int32_t> walk_len(static_cast<size_t>(landmarks)), walk_next(static_cast<size_t>(landmarks));
  int64_t next_landmark = 0;
  walk_interleaved(
      succ,
      [&](Walker& w) {
        if (next_landmark == landmarks) return false;
        w.slot = next_landmark++;
        w.cur = w.slot << shift;
        w.len = 1;
        return true;
      },
      [&](Walker& w, int64_t v) {
        if (landmark(v)) {
          walk_len[w.slot] = static_cast<int32_t>(w.len);
          walk_next[w.slot] = static_cast<int32_t>(v >> shift);
          return false;
        }
        marked.set(v);
        ++w.len;
        return true;
      });

  // 2. Cycles through no landmark, counted by their least unit.
  Layout layout(plan, max_segment);
  int64_t cursor = 0;
  auto next_start = [&](Walker& w) {
    while (cursor < units && (landmark(cursor) || marked.get(cursor) || succ(cursor) == cursor)) ++cursor;
    if (cursor == units) return false;
    w.cur = w.start = cursor++;
    w.len = 1;
    return true;
  };
  walk_interleaved(succ, next_start, [&](Walker& w, int64_t v) {
    if (v == w.start) {
      layout.count(w.len);
      return false;
    }
    if (v < w.start) return false;  // (the cycle's least unit marks this start as it walks)
    marked.set(v);
    ++w.len;
    return true;
  });

  // Chains of landmark walks: each cycle's length, from its least landmark.
  std::vector<bool> chained(static_cast<size_t>(landmarks), false);
  auto each_chain = [&](auto&& f) {
    std::fill(chained.begin(), chained.end(), false);
    for (int64_t i = 0; i < landmarks; ++i) {
      if (chained[i]) continue;
      int64_t len = 0;
      for (int64_t j = i; !chained[j]; j = walk_next[j]) {
        chained[j] = true;
        len += walk_len[j];
      }
      f(i, len);
    }
  };
  each_chain([&](int64_t, int64_t len) {
    if (len > 1) layout.count(len);
  });
  layout.allocate(pack_above);
  int32_t* order = layout.order;
  // Each landmark walk's place: its cycle's, plus the walks before it on the chain.
  each_chain([&](int64_t i, int64_t len) {
    if (len == 1) {
      walk_len[i] = -1;  // a fixed point
      return;
    }
    int64_t at = layout.place(len);
    int64_t j = i;
    do {
      const int64_t next = walk_next[j], walked = walk_len[j];
      walk_len[j] = static_cast<int32_t>(at);
      at += walked;
      j = next;
    } while (j != i);
  });

  // 1 again: each landmark walk writes its units, at places already set:
  // with two threads, each the walks of half the landmarks.
  auto fill_landmarks = [&](int64_t from, int64_t to) {
    int64_t next = from;
    walk_interleaved(
        succ,
        [&](Walker& w) {
          while (next < to && walk_len[next] < 0) ++next;
          if (next == to) return false;
          w.cur = next << shift;
          w.slot = walk_len[next++];
          order[w.slot++] = static_cast<int32_t>(w.cur);
          return true;
        },
        [&](Walker& w, int64_t v) {
          if (landmark(v)) return false;
          order[w.slot++] = static_cast<int32_t>(v);
          return true;
        });
  };
  if (threads >= 2 && units >= kThreadedUnits) {
    std::thread other([&] { fill_landmarks(landmarks / 2, landmarks); });
    fill_landmarks(0, landmarks / 2);
    other.join();
  } else {
    fill_landmarks(0, landmarks);
  }

  // 2 again, from the starts left unmarked: each walk holds up to
  // max_segment units, written once its cycle's length (its place) is
  // known; a longer cycle is walked on its own, twice.
  auto place_long = [&](int64_t s) {
    int64_t len = 1;
    for (int64_t u = succ(s); u != s; u = succ(u)) ++len;
    int64_t at = layout.place(len);
    int64_t u = s;
    for (int64_t k = 0; k < len; ++k, u = succ(u)) order[at++] = static_cast<int32_t>(u);
  };
  cursor = 0;
  walk_interleaved(
      succ,
      [&](Walker& w) {
        if (!next_start(w)) return false;
        w.held[0] = static_cast<int32_t>(w.start);
        return true;
      },
      [&](Walker& w, int64_t v) {
        if (v == w.start) {
          std::copy(w.held, w.held + w.len, order + layout.place(w.len));
          return false;
        }
        if (w.len == max_segment) {
          place_long(w.start);
          return false;
        }
        w.held[w.len++] = static_cast<int32_t>(v);
        return true;
      });
}

}  // namespace

RowPlan make_row_plan(const std::vector<int64_t>& perm, int64_t max_segment, int64_t pack_above) {
  return make_row_plan(perm.data(), static_cast<int64_t>(perm.size()), max_segment, pack_above);
}

RowPlan make_row_plan(const int64_t* perm, int64_t n, int64_t max_segment, int64_t pack_above, int threads) {
  RowPlan plan;
  plan.size = n;
  const int64_t g = block_size(perm, n);
  int64_t unit = 1;
  for (int64_t d = kMaxUnitRows; d >= 1; --d)
    if (g % d == 0) {
      unit = d;
      break;
    }
  plan.unit_rows = unit;
  const int64_t units = n / unit;
  if (units > INT32_MAX)
    throw std::invalid_argument("a permuted dim of " + std::to_string(n) + " indices moves " +
                                std::to_string(units) + " units; the row engine takes at most 2^31 - 1");
  if (max_segment < 1 || max_segment > kMaxSegment)  // a tile marks its cycles' ends in 64 bits
    throw std::invalid_argument("max_segment must be in [1, " + std::to_string(kMaxSegment) + "]");
  if (unit == 1)
    build_row_plan(plan, Successor<true>{perm, 1}, units, max_segment, pack_above, threads);
  else
    build_row_plan(plan, Successor<false>{perm, unit}, units, max_segment, pack_above, threads);
  return plan;
}

bool col_map_fits(int64_t n, int64_t element_size) { return n * element_size <= INT32_MAX; }

ColPlan make_col_plan(const std::vector<int64_t>& perm, int64_t element_size) {
  return make_col_plan(perm.data(), static_cast<int64_t>(perm.size()), element_size);
}

ColPlan make_col_plan(const int64_t* p, int64_t n, int64_t element_size) {
  if (!col_map_fits(n, element_size))
    throw std::invalid_argument("a row of " + std::to_string(n) + " elements of " +
                                std::to_string(element_size) +
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
      const int64_t src = !wraps                 ? pos[k + 1]
                          : s < plan.num_scratch ? order[first[plan.word()[s]]]
                                                 : pos[k + 1 - c];
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
bool applies(const RowPlan& plan, const int64_t* perm, int64_t n) {
  if (n != plan.size) return false;
  // The indices of moved units each as the plan says (none of them maps to
  // itself), in the plan's order, their loads prefetched ahead (a bit an
  // index to mark them, as permutation_of does, and a walk at latency took
  // a planned call longer than its moves); then the rest are fixed points
  // exactly when as many indices as they are map to themselves.
  const int64_t unit = plan.unit_rows;
  const int32_t* order = plan.order();
  const int32_t* first = plan.first();
  constexpr int64_t kAhead = 16;
  for (int64_t s = 0; s < plan.num_segments; ++s) {
    const int32_t* pos = order + first[s];
    const int64_t len = plan.length(s), c = plan.cycle_length(s);
    for (int64_t k = 0; k < len; ++k) {
      if (first[s] + k + kAhead < plan.moved) __builtin_prefetch(perm + int64_t{pos[k + kAhead]} * unit);
      const bool wraps = (k + 1) % c == 0;
      const int64_t src = !wraps                 ? pos[k + 1]
                          : s < plan.num_scratch ? order[first[plan.word()[s]]]
                                                 : pos[k + 1 - c];
      for (int64_t r = 0; r < unit; ++r)
        if (perm[pos[k] * unit + r] != src * unit + r) return false;
    }
  }
  int64_t fixed = 0;
  for (int64_t i = 0; i < n; ++i) fixed += perm[i] == i;
  return fixed == n - plan.moved * unit;
}
bool applies(const ColPlan& plan, const int64_t* perm, int64_t n) { return same_values(plan, perm, n); }

namespace {
// The layouts are only defined for these shapes; outside them the formulas
// would index past the end (the ops check first; gpu_launches relies on this).
void check_shape(bool ok, const char* what, int64_t heads, int64_t head_dim) {
  if (!ok)
    throw std::invalid_argument(std::string(what) + ": heads (" + std::to_string(heads) +
                                ") must be positive and head_dim (" + std::to_string(head_dim) +
                                ") a positive multiple of the layout's block");
}
}  // namespace

std::vector<int64_t> q_fused_permutation(int64_t num_heads, int64_t head_dim) {
  check_shape(num_heads > 0 && head_dim > 0 && head_dim % 16 == 0, "q_fused_permutation", num_heads,
              head_dim);
  // fused[(d / 16) * (H * 16) + h * 16 + d % 16] = standard[h * D + d]
  std::vector<int64_t> perm(static_cast<size_t>(num_heads * head_dim));
  for (int64_t h = 0; h < num_heads; ++h)
    for (int64_t d = 0; d < head_dim; ++d)
      perm[(d / 16) * (num_heads * 16) + h * 16 + d % 16] = h * head_dim + d;
  return perm;
}

std::vector<int64_t> o_fused_permutation(int64_t heads_per_group, int64_t head_dim) {
  check_shape(heads_per_group > 0 && head_dim > 0 && head_dim % 32 == 0, "o_fused_permutation",
              heads_per_group, head_dim);
  // fused[(c * G + h) * 32 + j] = standard[h * D + c * 32 + j]
  std::vector<int64_t> perm(static_cast<size_t>(heads_per_group * head_dim));
  for (int64_t h = 0; h < heads_per_group; ++h)
    for (int64_t c = 0; c < head_dim / 32; ++c)
      for (int64_t j = 0; j < 32; ++j) perm[(c * heads_per_group + h) * 32 + j] = h * head_dim + c * 32 + j;
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
