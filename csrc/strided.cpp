#include "strided.h"

#include <algorithm>

namespace flashmla_perm {
namespace {

std::vector<Dim> nontrivial(std::vector<Dim> dims) {
  dims.erase(std::remove_if(dims.begin(), dims.end(), [](const Dim& d) { return d.size <= 1; }), dims.end());
  return dims;
}

void sort_by_pitch(std::vector<Dim>& dims) {
  std::stable_sort(dims.begin(), dims.end(), [](const Dim& a, const Dim& b) { return a.pitch < b.pitch; });
}

// Inner first: an outer dim that continues the one inside it joins it.
std::vector<Dim> merged(const std::vector<Dim>& inner_first) {
  std::vector<Dim> out;
  for (const Dim& d : inner_first) {
    if (!out.empty() && d.pitch == out.back().size * out.back().pitch)
      out.back().size *= d.size;
    else
      out.push_back(d);
  }
  return out;
}

// Lines over dims (inner first): the first kMaxLineDims in a Lines, the
// rest as the byte offsets of one view each (row-major over the outer dims,
// the outermost slowest). A Lines of several dims holds fewer than
// max_mixed (kMaxMixedLines but in tests) lines (its 32-bit digits): its outermost dim is cut into
// chunks, one view each, chunk index fastest. `counts`: lines per view.
struct SplitLines {
  Lines at;
  std::vector<int64_t> offsets, counts;
};
SplitLines split_lines(const std::vector<Dim>& dims, int64_t max_mixed) {
  // Kept dims: at most kMaxLineDims, and those inside the outermost kept one
  // under kMaxMixedLines lines, so that a chunk of at least one index fits.
  int kept = static_cast<int>(std::min<size_t>(dims.size(), kMaxLineDims));
  auto inner_lines = [&](int k) {
    int64_t n = 1;
    for (int i = 0; i + 1 < k; ++i) n *= dims[i].size;
    return n;
  };
  while (kept > 1 && inner_lines(kept) >= max_mixed) --kept;
  SplitLines s{};
  s.at.dims = std::max(kept, 1);
  s.at.size[0] = 1;
  for (int i = 0; i < kept; ++i) {
    s.at.size[i] = dims[i].size;
    s.at.pitch[i] = dims[i].pitch;
  }
  set_line_divs(s.at);
  const int64_t inner = inner_lines(kept);
  const int64_t outer = kept > 0 ? dims[kept - 1].size : 1;
  const int64_t outer_pitch = kept > 0 ? dims[kept - 1].pitch : 0;
  const int64_t chunk = kept > 1 ? std::min(outer, (max_mixed - 1) / inner) : outer;
  std::vector<int64_t> bases = {0};
  for (size_t i = kept; i < dims.size(); ++i) {  // each outer dim multiplies the views
    std::vector<int64_t> next;
    next.reserve(bases.size() * dims[i].size);
    for (int64_t k = 0; k < dims[i].size; ++k)
      for (int64_t o : bases) next.push_back(o + k * dims[i].pitch);
    bases = std::move(next);
  }
  for (int64_t o : bases)
    for (int64_t c = 0; c < outer; c += chunk) {
      s.offsets.push_back(o + c * outer_pitch);
      s.counts.push_back(inner * std::min(chunk, outer - c));
    }
  return s;
}

}  // namespace

bool provably_disjoint(std::vector<Dim> dims, int64_t element_size) {
  for (const Dim& d : dims)
    if (d.size == 0) return true;  // no elements, nothing shares bytes
  dims = nontrivial(std::move(dims));
  sort_by_pitch(dims);
  int64_t span = element_size;
  for (const Dim& d : dims) {
    if (d.pitch < span) return false;  // also catches pitch 0
    span = (d.size - 1) * d.pitch + span;
  }
  return true;
}

std::vector<UnitView> unit_views(uint8_t* data, Dim permuted, int64_t unit, std::vector<Dim> others,
                                 int64_t element_size, int64_t max_mixed_lines) {
  std::vector<Dim> box = nontrivial(std::move(others));
  if (unit > 1) box.push_back({unit, permuted.pitch});
  sort_by_pitch(box);
  box = merged(box);
  int64_t run = element_size;
  if (!box.empty() && box.front().pitch == element_size) {
    run = box.front().size * element_size;
    box.erase(box.begin());
  }
  const SplitLines s = split_lines(box, max_mixed_lines);
  std::vector<UnitView> views;
  for (size_t v = 0; v < s.offsets.size(); ++v)
    views.push_back(UnitView{data + s.offsets[v], unit * permuted.pitch, s.counts[v], s.at, run});
  return views;
}

std::vector<ColView> col_views_in_place(uint8_t* data, std::vector<Dim> others, int64_t row_bytes,
                                        int64_t run, int64_t run_pitch, int64_t max_mixed_lines) {
  std::vector<Dim> rows = nontrivial(std::move(others));
  sort_by_pitch(rows);
  const SplitLines s = split_lines(merged(rows), max_mixed_lines);
  std::vector<ColView> views;
  for (size_t v = 0; v < s.offsets.size(); ++v) {
    uint8_t* d = data + s.offsets[v];
    views.push_back(ColView{d, d, s.at, s.at, s.counts[v], row_bytes, run, run_pitch});
  }
  return views;
}

std::vector<ColView> col_views_out(const uint8_t* src, uint8_t* dst, std::vector<Dim> rows_inner_first,
                                   int64_t row_bytes, int64_t max_mixed_lines) {
  // Order matters here (dst is packed in the tensor's order): merge, never sort.
  const SplitLines s = split_lines(merged(nontrivial(std::move(rows_inner_first))), max_mixed_lines);
  std::vector<ColView> views;
  int64_t done = 0;  // rows of the views before this one: dst is packed in view order
  for (size_t v = 0; v < s.offsets.size(); ++v) {
    const int64_t n = s.counts[v];
    views.push_back(ColView{src + s.offsets[v], dst + done * row_bytes, s.at, lines_1d(n, row_bytes), n,
                            row_bytes, row_bytes, row_bytes});
    done += n;
  }
  return views;
}

}  // namespace flashmla_perm
