"""Mutation check: small bugs planted one at a time in a copy of the tree,
each of which some test must catch (docs/testing.md has the table).

    python scripts/mutants.py                 # every mutant
    python scripts/mutants.py slice-offset-serial plan-scratch-slot   # some
    python scripts/mutants.py --list          # names, files, tests
    python scripts/mutants.py --all           # every listed test of each mutant
    python scripts/mutants.py --check         # each mutant's place still in its file, once

The tree (tracked and untracked, not ignored, files) is copied into
--workdir (default /tmp/flashmla_perm_mutants), which is kept between runs:
the native module is built there in place (setup.py build_ext, ninja) and
the host harness with CMake, once. Each mutant rewrites one file, rebuilds
(ninja recompiles only the translation units that include it), runs its
tests until one fails, then puts the file back with its old timestamp and
the old object files beside it, so the next mutant's build starts from the
clean tree's objects again. A baseline run first checks that every listed
test passes on the clean tree.

A mutant is (file, the code it replaces, the new text, tests). The code is
found by its tokens, whatever the whitespace and comments between them
(place()), so a reformat or a reworded comment moves no mutant; code found
other than exactly once fails loudly, when the mutants run. Tests are pytest selections
(run in the copy, against its module) or harness runs ("harness",
"harness --model"). Exit status 1 if any mutant survives or fails to build.
"""

import argparse
import dataclasses
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
# A mutant that makes a test loop (check-perm-range can: planning walks past
# the perm's end) is killed by the test's time limit; the clean run's time
# sets it, so a hang costs a minute or two, not the whole --timeout.
HANG_FACTOR, HANG_FLOOR_S = 10, 60


@dataclasses.dataclass
class Mutant:
    name: str
    file: str
    old: str
    new: str
    tests: list  # pytest selections ("tests/x.py::y") or "harness ..." runs
    why: str = ""
    needs_cuda: bool = False  # only CUDA tests can catch it: "needs a GPU" elsewhere
    needs_cuda_build: bool = False  # only a CUDA build's tests (no GPU) can: run in a CUDA torch's venv


M = Mutant
# A table, one mutant to a block as written: the formatter leaves it be.
# fmt: off
MUTANTS = [
    # ---- plan construction (csrc/plan.cpp)
    M("plan-last-segment-short", "csrc/plan.cpp",
      "first[plan.num_segments] = static_cast<int32_t>(plan.moved);",
      "first[plan.num_segments] = static_cast<int32_t>(plan.moved - 1);",
      ["tests/test_ops.py", "harness --quick"],
      "make_row_plan: the last segment one unit short (its last unit never written)"),
    M("plan-col-identity-half", "csrc/plan.cpp",
      "for (int64_t i = 0; i < n && plan.identity; ++i) plan.identity = p[i] == i;",
      "for (int64_t i = 0; i < n / 2 && plan.identity; ++i) plan.identity = p[i] == i;",
      ["tests/test_ops.py::test_a_swap_at_either_end_still_moves", "tests/test_ops.py"],
      "make_col_plan: the identity decided on the first half (a permutation of the second half skipped)"),
    # ---- cycle segments and scratch slots (csrc/plan.cpp)
    M("plan-whole-cycle-start", "csrc/plan.cpp",
      "first[whole_slot++] = static_cast<int32_t>(at);",
      "first[whole_slot++] = static_cast<int32_t>(at + 1);",
      ["tests/test_ops.py", "harness --quick"],
      "make_row_plan: a whole cycle's segment starts one unit late (the segment before runs into it)"),
    M("plan-scratch-slot", "csrc/plan.cpp",
      "word[cut_slot++] = static_cast<int32_t>(first_slot + (s + 1) % nseg);",
      "word[cut_slot++] = static_cast<int32_t>(first_slot + s);",
      ["tests/test_row_segments.py", "harness --quick"],
      "a segment's tail read from its own scratch slot instead of the next segment's"),
    # ---- short cycles packed into shared segments (csrc/plan.cpp, csrc/tile_bodies.h)
    M("plan-never-packs", "csrc/plan.cpp",
      "pack = num_short > pack_above;",
      "pack = false;",
      ["tests/test_extra_memory.py", "harness --quick"],
      "make_row_plan: short cycles never packed (a segment start each: 6 bytes an index for 2-cycles)"),
    M("plan-packed-cycle-length", "csrc/plan.cpp",
      "word[seg_of[len]++] = static_cast<int32_t>(len);",
      "word[seg_of[len]++] = static_cast<int32_t>(2);",
      ["tests/test_row_segments.py::test_many_short_cycles_share_segments", "harness --quick"],
      "make_row_plan: every packed segment said to hold 2-cycles"),
    M("packed-serial-one-cycle", "csrc/tile_bodies.h",
      "for (const int32_t* c = pos; c < pos + len; c += cycle) {",
      "for (const int32_t* c = pos; c < pos + cycle; c += cycle) {",
      ["tests/test_row_segments.py::test_many_short_cycles_share_segments", "harness --quick"],
      "serial row tile: only the first cycle of a packed segment rotated"),
    M("packed-wrap-to-group-start", "csrc/tile_bodies.h",
      "const uint32_t from = last ? k + 1 - ps.cyc : 1 + ii;",
      "const uint32_t from = last ? 0 : 1 + ii;",
      ["harness --quick"],
      "threaded row tile: every cycle of a pass wraps to the pass's first unit, not its own"),
    M("packed-group-whole-segment", "csrc/tile_bodies.h",
      "const uint32_t group = cyc * (step >= cyc ? step / cyc : 1);",
      "const uint32_t group = slen;",
      ["harness --quick"],
      "threaded row tile: a packed segment's cycles in one group however many passes it takes (a cycle's first unit restaged over before its last position reads it)"),
    # ---- the line slice's offset in scratch (csrc/tile_bodies.h), both forms
    M("slice-offset-serial", "csrc/tile_bodies.h",
      "at->offset(l0 + l), t.scratch_src + l * p.line_bytes,",
      "at->offset(l0 + l), t.scratch_src + l * width,",
      ["tests/test_row_segments.py", "harness --quick"],
      "serial row tile: scratch line l read at l * slice width, not l * line bytes"),
    M("slice-offset-threaded", "csrc/tile_bodies.h",
      "warp_copy_line<V>(w, dst, t.scratch_src + l * p.line_bytes, rl.width);",
      "warp_copy_line<V>(w, dst, t.scratch_src + l * rl.width, rl.width);",
      ["harness --quick"],
      "threaded row tile: the same, as the GPU runs it"),
    # ---- chunk sizes (csrc/plan.cpp, csrc/tile_bodies.h)
    M("chunk-shift-too-wide", "csrc/plan.cpp",
      "run_bytes % (int64_t{2} << shift) == 0) ++shift;",
      "run_bytes % (int64_t{1} << shift) == 0) ++shift;",
      ["tests/test_ops.py", "harness --quick"],
      "make_col_plan: chunks one doubling wider than the runs allow"),
    M("chunk-pieces-packed-wrong", "csrc/tile_bodies.h",
      "packed |= static_cast<uint64_t>(piece) << (8 * V * i);",
      "packed |= static_cast<uint64_t>(piece) << (8 * i);",
      ["tests/test_ops.py", "tests/test_scale.py", "harness --quick"],
      "serial column gather: 2- and 4-byte chunks packed into the 8-byte store at byte, not chunk, offsets"),
    # ---- the scale half of each model op (csrc/ops.cpp)
    M("wq_b-scale-not-permuted", "csrc/ops.cpp",
      "apply_rows({{weight, 0}, {weight_scale, 0}}, entry);",
      "apply_rows({{weight, 0}}, entry);",
      ["tests/test_model.py", "tests/test_scale.py"],
      "permute_wq_b_: the scale left out of the launch"),
    M("wo_a-scale-plan-not-inverted", "csrc/ops.cpp",
      "packed ? 1 : weight_scale.element_size(), inverse);",
      "packed ? 1 : weight_scale.element_size(), false);",
      ["tests/test_model.py", "tests/test_scale.py"],
      "wo_a_in_place: the scale's plan ignores inverse"),
    # ---- the op layer's in-place semantics (csrc/ops.cpp, csrc/checks.cpp)
    M("in-place-counts-no-writes", "csrc/ops.cpp",
      "  for (const at::Tensor& t : written) t.unsafeGetTensorImpl()->bump_version();\n",
      "",
      ["tests/test_in_place.py"],
      "count_writes: the in-place ops leave their tensors' version counters as they were "
      "(autograd then computes a wrong gradient through a tensor permuted after it was saved)"),
    M("inference-tensor-written", "csrc/checks.cpp",
      "!t.is_inference() || c10::InferenceMode::is_enabled()",
      "true",
      ["tests/test_in_place.py"],
      "check_writable lets an inference tensor be written outside inference mode"),
    M("model-ops-empty-shard-planned", "csrc/ops.cpp",
      "  if (head_dim == 0) return;  // no rows: nothing moves (the reference's answer too)\n",
      "",
      ["tests/test_model.py::test_empty_shards_are_left_as_the_reference_leaves_them"],
      "permute_wq_b_ plans a shard of no rows (head_dim 0) and raises, where the reference does nothing"),
    M("cpu-arena-slot-by-recount", "csrc/cpu_executor.cpp",
      "      if ((t + 1) * stride > arena_bytes) {",
      "      if (t >= count) {",
      ["tests/test_ops.py::test_a_threads_count_changing_under_a_call_stays_in_its_buffers"],
      "a CPU tile loop's thread takes an arena slot by a thread count taken again after the arena was sized "
      "(the first parallel_for on a thread can raise it): a heap overflow"),
    M("plugin-routes-any-signature", "flashmla_perm/vllm_plugin.py",
      "        if _parameters(original) == _parameters(ours):",
      "        if True:",
      ["tests/test_vllm.py::test_register_leaves_a_function_that_takes_other_arguments"],
      "the vLLM plugin routes a permute_on_load that takes other arguments than ours"),
    # ---- plan caches (csrc/bounded_cache.h, csrc/plan_cache.cpp, csrc/perm_cache.cpp)
    M("cache-never-stores", "csrc/bounded_cache.h",
      "    put(key, made);\n    return made;",
      "    return made;",
      ["tests/test_prepared.py"],
      "BoundedCache::get makes a value every time and keeps none (model plans rebuilt per layer)"),
    M("cache-evicts-newest", "csrc/bounded_cache.h",
      "      index_.erase(order_.back().first);\n      order_.pop_back();",
      "      index_.erase(order_.front().first);\n      order_.pop_front();",
      ["tests/test_prepared.py"],
      "BoundedCache::put evicts the entry it just stored, not the least recently used"),
    M("plan-cache-key-ignores-inverse", "csrc/plan_cache.cpp",
      "return row_cache().get({num_heads, head_dim, inverse}, [&] {",
      "return row_cache().get({num_heads, head_dim, false}, [&] {",
      ["tests/test_model.py"],
      "the wq_b plan cache hands out the forward plan for the inverse"),
    M("perm-cache-never-stores", "csrc/perm_cache.cpp",
      "if (!found || !found->has_plans()) by_values().put(key, made);",
      "(void)found;",
      ["tests/test_prepared.py"],
      "prepared permutations never cached by value (a plan per call)"),
    M("perm-cache-ignores-version", "csrc/perm_cache.cpp",
      "static_cast<int64_t>(perm._version()) == version &&",
      "true &&",
      ["tests/test_prepared.py::test_a_device_perm_is_found_by_the_tensor_and_its_version"],
      "a device perm written in place is found by its address and reused with the old values",
      needs_cuda=True),
    M("gather-ignores-shared-perm", "csrc/apply.cpp",
      "overlap(byte_layout(perm), byte_layout(self)) != Overlap::kNo)",
      "false)",
      ["tests/test_generic.py::test_a_perm_sharing_memory_with_the_tensor_through_another_storage"],
      "the gather path takes a perm that shares self's memory through another storage (read after written)"),
    # ---- the kernels built at install and their load (csrc/cuda/), through the stand-in driver
    M("load-wrong-familys-cubin", "csrc/cuda/kernels.cpp",
      "if (m == major && n <= minor && n > best_minor) {",
      "if (n <= minor && n > best_minor) {",
      ["tests/test_stub_driver.py::test_each_gpu_loads_its_familys_cubin_else_the_ptx"],
      "a GPU of another major (sm_110) given sm_100's cubin, which cannot run there",
      needs_cuda_build=True),
    M("load-ptx-not-tried", "csrc/cuda/kernels.cpp",
      "for (const KernelImage* image : {family_cubin(major, minor), ptx_image()}) {",
      "for (const KernelImage* image : {family_cubin(major, minor)}) {",
      ["tests/test_stub_driver.py::test_a_refused_cubin_falls_back_to_the_ptx"],
      "a GPU with no cubin of its family (or one the driver refuses) never tries the PTX: torch's gather",
      needs_cuda_build=True),
    M("launch-block-of-the-wrong-size", "csrc/cuda/kernels.cpp",
      "size_t bytes = is_cols ? sizeof(cols) : sizeof(rows);",
      "size_t bytes = sizeof(rows);",
      ["tests/test_stub_driver.py::test_every_launch_passes_the_block_its_kernel_declares_within_its_shared_memory"],
      "the column kernels' parameter block passed at the row kernels' size",
      needs_cuda_build=True),
    M("load-param-size-unchecked", "csrc/cuda/kernels.cpp",
      "const size_t kParamBytes[kNumFunctions] = {sizeof(Jobs<RowJob>), sizeof(Jobs<RowJob>), sizeof(Jobs<ColJob>),",
      "const size_t kParamBytes[kNumFunctions] = {sizeof(Jobs<RowJob>), sizeof(Jobs<RowJob>), sizeof(Jobs<RowJob>),",
      ["tests/test_stub_driver.py::test_each_gpu_loads_its_familys_cubin_else_the_ptx"],
      "the host's idea of the column kernels' parameter size wrong: every image refused, torch's gather",
      needs_cuda_build=True),
    M("load-context-not-restored", "csrc/cuda/driver.cpp",
      "if (changed_) driver().CtxSetCurrent(previous_);",
      "(void)changed_;",
      ["tests/test_stub_driver.py::test_every_launch_passes_the_block_its_kernel_declares_within_its_shared_memory"],
      "the device's primary context left current on the caller's thread",
      needs_cuda_build=True),
    M("plugin-asks-the-driver", "flashmla_perm/vllm_plugin.py",
      "archs = _kernels.gpu_archs()",
      "archs = (_kernels.gpu_archs(), __import__('flashmla_perm')._ops._C.load_kernels(0))[0]",
      ["tests/test_stub_driver.py::test_registering_the_plugin_calls_nothing_of_cuda"],
      "registration loads the kernels (cuInit in vLLM's parent, whose forked workers then cannot use CUDA)",
      needs_cuda_build=True),
    # ---- extra memory (csrc/launch.cpp): the bound in docs/api.md
    M("cpu-staging-unbounded", "csrc/launch.cpp",
      "return (v.run < v.row_bytes ? 2 : 1) * v.row_bytes <= kCpuStagingBudget;",
      "return true;",
      ["tests/test_extra_memory.py"],
      "cpu_cols_staged_fit: rows of any width staged whole, a buffer per thread (4 MiB rows: over the bound)"),
    # ---- argument checks (csrc/checks.cpp, csrc/plan.cpp)
    M("check-pair-gives-up-on-views", "csrc/checks.cpp",
      "if (a.is_meta() || b.is_meta() || a.numel() == 0 || b.numel() == 0) return;",
      "if (a.is_meta() || b.is_meta() || a.numel() == 0 || b.numel() == 0 || !a.is_contiguous()) return;",
      ["tests/test_overlap.py", "tests/test_bad_input.py"],
      "check_pair gives up on a weight that is not dense (the audit's bug: w = b[:, :128], s = b[:, 100:104])"),
    M("check-perm-length", "csrc/checks.cpp",
      "TORCH_CHECK_VALUE(perm.numel() == extent, op,",
      "TORCH_CHECK_VALUE(perm.numel() >= extent, op,",
      ["tests/test_bad_input.py"],
      "check_perm_tensor: a perm longer than the dim accepted"),
    M("check-perm-range", "csrc/plan.cpp",
      "if (v < 0 || v >= n)",
      "if (v < 0 || v > n)",
      ["tests/test_bad_input.py"],
      "check_permutation: index n accepted"),
    M("check-perm-duplicates", "csrc/plan.cpp",
      "if (seen[v >> 6] & bit)",
      "if (false && (seen[v >> 6] & bit))",
      ["tests/test_generic.py::test_the_gather_path_checks_perm_before_moving", "tests/test_bad_input.py"],
      "check_permutation: a repeated index accepted"),
    # ---- the plan builder's walks (csrc/plan.cpp)
    M("builder-drops-a-walker", "csrc/plan.cpp",
      "k = w[--active];  // the last walker takes this slot",
      "--active;  // the last walker takes this slot",
      ["harness --quick", "tests/test_generic.py"],
      "walk_interleaved: a walk ended, the last active walker is dropped instead of moved into its slot"),
    M("builder-long-cycle-short", "csrc/plan.cpp",
      "for (int64_t k = 0; k < len; ++k, u = succ(u)) order[at++]",
      "for (int64_t k = 0; k + 1 < len; ++k, u = succ(u)) order[at++]",
      ["harness --quick", "tests/test_generic.py"],
      "build_row_plan: a long cycle through no landmark written one unit short"),
    M("builder-walk-offset", "csrc/plan.cpp",
      "      at += walked;\n",
      "      at += walked - (walked > 1);\n",
      ["harness --quick", "tests/test_generic.py"],
      "build_row_plan: landmark walks after the first of a chain placed a unit early"),
    M("applies-skips-fixed-points", "csrc/plan.cpp",
      "return fixed == n - plan.moved * unit;",
      "return true;",
      ["harness --quick", "tests/test_prepared.py"],
      "applies: indices outside the plan's cycles never compared (a perm that moves them found as planned)"),
    # ---- narrow units on the CPU (csrc/cpu_gather.cpp, csrc/cpu_executor.cpp, csrc/apply.cpp)
    M("gather-lines-from-zero", "csrc/cpu_gather.cpp",
      "off[j] = v.line_at.offset(l0 + j);",
      "off[j] = v.line_at.offset(j);",
      ["tests/test_generic.py"],
      "gather: every pass gathers the first lines of each unit"),
    M("gather-unchecked", "csrc/cpu_gather.cpp",
      "  return found == n;",
      "  return true;",
      ["tests/test_generic.py::test_the_gather_path_checks_perm_before_moving"],
      "gather_pass: a repeated index passes the gather path's check"),
    M("narrow-tail-own-slot", "csrc/cpu_executor.cpp",
      "cut ? scratch + int64_t{word[s]} * w : held",
      "cut ? scratch + s * w : held",
      ["tests/test_generic.py"],
      "narrow mover: a cut segment's last unit from its own scratch slot, not the next segment's"),
    M("narrow-head-second-unit", "csrc/cpu_executor.cpp",
      "copy(scratch + s * w, unit(order[first[s]]));",
      "copy(scratch + s * w, unit(order[first[s] + 1]));",
      ["tests/test_generic.py"],
      "narrow mover: the save pass keeps each cut segment's second unit"),
    # ---- the exact overlap check (csrc/overlap.cpp, branch overlap-exact)
    M("overlap-edge-byte", "csrc/overlap.cpp",
      "!add(a.element_size, b.element_size - 1, &bytes))",
      "!add(a.element_size, b.element_size - 2, &bytes))",
      ["tests/test_overlap.py", "tests/test_bad_input.py"],
      "meet: elements that share only their edge byte seen apart"),
    # ---- threaded tile bodies (csrc/tile_bodies.h): only the harness runs them on a CPU
    M("fast-div-shift", "csrc/tile_bodies.h",
      "return static_cast<uint32_t>((static_cast<uint64_t>(n) * m) >> shift);",
      "return static_cast<uint32_t>((static_cast<uint64_t>(n) * m) >> (shift + 1));",
      ["harness --quick"],
      "FastDiv: the row tile's item digits off by a power of two (the divide the GPU loops no longer do)"),
    M("line-divisors-unset", "csrc/strided.cpp",
      "  set_line_divs(s.at);\n",
      "",
      ["harness --quick"],
      "split_lines: a Lines of several dims keeps its default divisors (by 1: every line at the inner dim's digit)"),
    M("lines-from-multi-dim-from-zero", "csrc/tile_bodies.h",
      "return at.dims == 1 ? line(l, OneDim{}) : start + at.offset(first + l);",
      "return at.dims == 1 ? line(l, OneDim{}) : start + at.offset(l);",
      ["harness --quick"],
      "LinesFrom: a tile's lines of several dims counted from line 0, not its first"),
    M("row-last-slice-divisor", "csrc/launch.cpp",
      "p.per_line_div[1] = FastDiv(static_cast<uint32_t>(std::max<int64_t>(1, last_bytes / p.vec)));",
      "p.per_line_div[1] = p.per_line_div[0];",
      ["harness --quick"],
      "set_row_slices: a line's last, narrower slice split into items as if it were full"),
    M("col-last-tile-divisor", "csrc/launch.cpp",
      "p.items_div[1] = at_least_1(p.rows - (p.tiles - 1) * p.tile_rows);",
      "p.items_div[1] = p.items_div[0];",
      ["harness --quick"],
      "set_col_items: a rows-fastest job's last tile, with fewer rows, split into items as if it were full"),
    M("gathered-slice-missed-offset", "csrc/tile_bodies.h",
      "s = rows.line(r, AnyDims{}) + offset[c >> shift] + (c & mask);",
      "s = rows.line(r, AnyDims{}) + c;",
      ["harness --quick", "harness --model"],
      "col_gathered_stage: the stage loop reads the row in order (the wo_a weight left unpermuted on a GPU)"),
    M("two-stage-waits-for-none", "csrc/tile_bodies.h",
      "ctx.template stage_wait_prior<1>();  // every group but the newest: tile t's",
      "ctx.template stage_wait_prior<2>();  // every group but the newest: tile t's",
      ["harness --quick", "harness --model"],
      "two_stage_loop: tile t stores before its loads have landed (the newest two groups left in flight)"),
    M("two-stage-same-buffer", "csrc/tile_bodies.h",
      "half(t + step, buf + (buf_bytes - at), false);",
      "half(t + step, buf + at, false);",
      ["harness --quick", "harness --model"],
      "two_stage_loop: the next tile staged into the buffer this one is about to store from"),
    M("staged-half-drops-buffer-gathers", "csrc/tile_bodies.h",
      "return stage_bytes > 0 && (!staged || gathers_in_stage(p, 16, true));",
      "return stage_bytes > 0;",
      ["harness --quick", "harness --model"],
      "col_two_stages: a staged tile that gathers from its buffer (the per-32 scales) sent to two_stage_loop, "
      "whose halves move only tiles gathered in the stage loop (it never runs under two stages)"),
    M("staged-two-stage-full-budget", "csrc/launch.cpp",
      "p.tile_rows = staged_tile_rows(p.rows, p.buf_pitch, tile_budget(dev) / 2, dev);",
      "p.tile_rows = staged_tile_rows(p.rows, p.buf_pitch, tile_budget(dev), dev);",
      ["harness --quick", "tests/test_launches.py"],
      "set_two_stages: staged tiles keep the whole budget, so two buffers overrun the shared memory planned"),
    M("row-half-packed-one-cycle", "csrc/tile_bodies.h",
      "  ps.ends = cycle_ends(ps.cyc, slen);",
      "  ps.ends = cycle_ends(slen, slen);",
      ["harness --quick"],
      "row_segment_half: a packed segment's cycles end only at its last unit (each cycle's wrap lost)"),
    M("row-two-stage-full-budget", "csrc/launch.cpp",
      "main = row_launch(views, n, plan, index, tile_budget(dev) / 2, dev);",
      "main = row_launch(views, n, plan, index, tile_budget(dev), dev);",
      ["harness --quick", "tests/test_launches.py"],
      "gpu_row_launches: two-stage row tiles keep the whole budget, so two buffers overrun the shared memory planned"),
    M("row-two-stage-any-width", "csrc/launch.cpp",
      "if (p.vec != 16 || p.step < max_len || p.tiles >= kTwoStageMaxTiles) return false;",
      "if (p.step < max_len || p.tiles >= kTwoStageMaxTiles) return false;",
      ["harness --quick"],
      "set_row_two_stages: two stages at any vector width (the kernel's two-stage loop is V = 16 only)"),
    M("row-two-stage-several-passes", "csrc/launch.cpp",
      "if (p.vec != 16 || p.step < max_len || p.tiles >= kTwoStageMaxTiles) return false;",
      "if (p.vec != 16 || p.tiles >= kTwoStageMaxTiles) return false;",
      ["harness --quick"],
      "set_row_two_stages: two stages for tiles of several passes (their later passes never run)"),
    M("threaded-missing-barrier", "csrc/tile_bodies.h",
      "        row_pass_stage<V>(ctx, p, t, ps, buf);\n        ctx.stage_wait();\n        ctx.sync();",
      "        row_pass_stage<V>(ctx, p, t, ps, buf);\n        ctx.stage_wait();",
      ["harness --quick"],
      "row tile: stores from the buffer before the other threads' stages landed"),
    M("warp-lanes-whole-always", "csrc/tile_bodies.h",
      "lanes = min_of(s, min_of(kWarp, n - warp * kWarp) - sub * s);",
      "lanes = s;",
      ["harness --quick"],
      "Warp: a host tile's partial last warp strides as if its lines' lanes were whole (vectors of lanes past the last thread never move)"),
    M("threaded-thread-stride", "csrc/tile_bodies.h",
      "const uint32_t stride = ctx.num_threads();",
      "const uint32_t stride = ctx.num_threads() + 1;",
      ["harness --quick"],
      "store_items: threads stride one item too far (items skipped)"),
    M("store-items-no-tail", "csrc/tile_bodies.h",
      "  for (; base < total; base += stride) {\n    uint8_t* d;",
      "  for (; base < total && false; base += stride) {\n    uint8_t* d;",
      ["harness --quick"],
      "store_items: the items below a whole batch never move"),
    M("copy-line-no-tail", "csrc/tile_bodies.h",
      "  for (; c < width; c += stride) {",
      "  for (; c + stride < width; c += stride) {",
      ["harness --quick"],
      "copy_line: a lane's last vector below a whole batch never moves"),
    # ---- launch planning (csrc/launch.cpp), as the harness runs the CUDA executor's launches
    M("launch-row-byte-tiles", "csrc/launch.cpp",
      "p.byte_tiles = ceil_div(p.line_bytes, slice_bytes);",
      "p.byte_tiles = p.line_bytes / slice_bytes;",
      ["harness --model", "harness --quick"],
      "row launches: a line's last, partial slice gets no tile"),
    M("launch-col-tiles", "csrc/launch.cpp",
      "p.tiles = ceil_div(v.rows, p.tile_rows) * p.row_tiles;",
      "p.tiles = v.rows / p.tile_rows * p.row_tiles;",
      ["harness --model", "harness --quick"],
      "column launches: the last, partial tile of rows never runs"),
    M("grid-split-starves-second-job", "csrc/launch.cpp",
      "first = std::min(first, std::min(t0, grid - (t1 > 0 ? 1 : 0)));",
      "first = std::min(first, t0);",
      ["harness --quick"],
      "split_grid: a job whose share of the grid rounds to no CTA gets none (its tiles never run)"),
    M("cta-tiles-stride-whole-grid", "csrc/device_launch.h",
      "return {job, job ? cta - first_ctas : cta, job ? grid - first_ctas : first_ctas};",
      "return {job, job ? cta - first_ctas : cta, grid};",
      ["harness --model", "harness --quick"],
      "cta_tiles: a CTA strides over its job's tiles by the whole grid, not its job's CTAs (tiles skipped)"),
    M("launch-vec-ignores-dst", "csrc/launch.cpp",
      "p.vec = vector_width({reinterpret_cast<int64_t>(v.src), reinterpret_cast<int64_t>(v.dst),",
      "p.vec = vector_width({reinterpret_cast<int64_t>(v.src),",
      ["harness --quick"],
      "column launches: the vector width ignores the destination's address (misaligned stores)"),
    # ---- the vLLM plugin (flashmla_perm/vllm_plugin.py): what a worker's log shows
    M("plugin-logger-outside-vllm", "flashmla_perm/vllm_plugin.py",
      'logger = logging.getLogger("vllm.plugins.flashmla_perm")',
      'logger = logging.getLogger("flashmla_perm.vllm_plugin")',
      ["tests/test_vllm.py::test_plugin_says_what_it_routed_in_a_worker_log"],
      "the plugin's logger outside vLLM's (no handler: its INFO lines never show)"),
    # ---- the vLLM plugin: routed only once shown equal, all or nothing
    M("plugin-routes-unproven", "flashmla_perm/vllm_plugin.py",
      "        why = _differs(original, ours) or _probe(name, original, ours)",
      "        why = _differs(original, ours)",
      ["tests/test_vllm.py::test_register_routes_only_a_function_shown_to_write_our_bytes"],
      "the plugin routes a permute_on_load with 0.33.0's signature that writes other bytes (the inverse)"),
    M("plugin-probe-raise-is-equal", "flashmla_perm/vllm_plugin.py",
      '                        return f"{who} raised {type(e).__name__} on {what}: {said}"',
      "                        return None",
      ["tests/test_vllm.py::test_register_routes_only_a_function_shown_to_write_our_bytes"],
      "the probe takes a function that raises for one that writes our bytes"),
    M("plugin-probe-dim-0-only", "flashmla_perm/vllm_plugin.py",
      "    return [(what, lambda fn, c=c: _loaded(fn, *c)) for what, *c in cases]",
      "    return [(what, lambda fn, c=c: _loaded(fn, *c)) for what, *c in cases if c[3] == 0]",
      ["tests/test_vllm.py::test_register_routes_only_a_function_shown_to_write_our_bytes"],
      "the probe runs permute_on_load along dim 0 only (wo_a's dim 1 unchecked)"),
    M("plugin-probe-weight-only", "flashmla_perm/vllm_plugin.py",
      "                if not all(torch.equal(a, b) for a, b in zip(*results)):",
      "                if not torch.equal(results[0][0], results[1][0]):",
      ["tests/test_vllm.py::test_register_runs_the_model_ops_before_routing_them"],
      "the probe compares a model op's weight, not its scale"),
    M("plugin-no-rollback", "flashmla_perm/vllm_plugin.py",
      "    for module_name, module, name in reversed(found[: i + 1]):",
      "    for module_name, module, name in []:",
      ["tests/test_vllm.py::test_register_routes_nothing_where_one_caller_refuses_ours"],
      "a caller that refuses ours leaves the modules before it routed, and the line says nothing changed"),
    M("plugin-trusts-setattr", "flashmla_perm/vllm_plugin.py",
      '            if _namespace(module).get(name) is not ours:\n                raise RuntimeError("the name did not change")',
      "            pass",
      ["tests/test_vllm.py::test_register_routes_nothing_where_one_caller_refuses_ours"],
      "a module whose setattr does nothing is counted as routed"),
    M("plugin-says-nothing-changed-when-stuck", "flashmla_perm/vllm_plugin.py",
      '    if stuck:  # the line must not say "changed nothing"',
      "    if False:",
      ["tests/test_vllm.py::test_register_says_where_ours_could_not_be_taken_back"],
      "ours left in a caller that would not give it back, and the line says nothing changed"),
    M("plugin-scan-unguarded", "flashmla_perm/vllm_plugin.py",
      "except Exception as e:  # noqa: BLE001 -- an odd entry must not stop the rest\n            unreadable.append(",
      "except ZeroDivisionError as e:\n            unreadable.append(",
      ["tests/test_vllm.py::test_register_reads_past_attribute_hooks_and_skips_what_it_cannot_read"],
      "one sys.modules entry whose attributes raise stops the routing"),
    M("plugin-reads-through-hooks", "flashmla_perm/vllm_plugin.py",
      "        return _MODULE_DICT.__get__(module)",
      "        return module.__dict__",
      ["tests/test_vllm.py::test_register_reads_past_attribute_hooks_and_skips_what_it_cannot_read",
       "tests/test_vllm.py::test_register_routes_nothing_where_one_caller_refuses_ours"],
      "a module's namespace read through its class's attribute hooks (a caller that raises is skipped)"),
    M("plugin-meta-path-edited-in-place", "flashmla_perm/vllm_plugin.py",
      "    sys.meta_path = [f for f in sys.meta_path if type(f) is not _RouteOnImport]",
      "    sys.meta_path[:] = [f for f in sys.meta_path if type(f) is not _RouteOnImport]",
      ["tests/test_vllm.py::test_the_import_hook_never_edits_the_finder_list_an_import_walks"],
      "the hook takes itself out of the list another thread's import is walking (it skips a finder)"),
    # ---- the on/off switches (flashmla_perm/_switches.py and its readers)
    M("plugin-switch-refusal-ignored", "flashmla_perm/vllm_plugin.py",
      "    except ValueError as e:\n        return str(e)",
      "    except ValueError:\n        return None",
      ["tests/test_switches.py::test_the_plugin_switch_refused"],
      "FLASHMLA_PERM_VLLM=garbage routes, without a word"),
    M("switch-exact-words", "flashmla_perm/_switches.py",
      '    word = (value or "").strip().lower()',
      '    word = value or ""',
      ["tests/test_switches.py::test_words_in_any_case"],
      "a switch reads only its words as written: ' 0' and 'FALSE' refused"),
    M("switch-other-value-is-default", "flashmla_perm/_switches.py",
      "    raise ValueError(\n",
      "    return default\n    raise ValueError(\n",
      ["tests/test_switches.py::test_other_values_are_refused_by_name_and_value"],
      "a switch reads a typo as its default"),
    M("force-reference-exact-1", "flashmla_perm/_ops.py",
      'FORCE_REFERENCE = switch("FLASHMLA_PERM_FORCE_REFERENCE", False)',
      'FORCE_REFERENCE = os.environ.get("FLASHMLA_PERM_FORCE_REFERENCE", "") == "1"',
      ["tests/test_switches.py::test_force_reference_at_import"],
      "FLASHMLA_PERM_FORCE_REFERENCE=true leaves the native module on"),
    M("expectations-exact-1", "tests/conftest.py",
      '        expect = {k: switch(f"FLASHMLA_PERM_EXPECT_{k}", False) for k in ("NATIVE", "CUDA", "VLLM")}',
      '        expect = {k: os.environ.get(f"FLASHMLA_PERM_EXPECT_{k}") == "1" for k in ("NATIVE", "CUDA", "VLLM")}',
      ["tests/test_switches.py::test_the_suites_expectations_on"],
      "the suite reads FLASHMLA_PERM_EXPECT_CUDA=yes as expect nothing"),
    # ---- the benchmark's baselines (bench/)
    M("baseline-changes-bytes", "bench/bench_load_time.py",
      "words(t).bitwise_or_(0)",
      "words(t).bitwise_or_(1)",
      ["tests/test_bench.py"],
      "the in-place baseline writes other bytes (it would time a different pass)"),
    M("copy-one-buffer", "bench/bench_load_time.py",
      '"copy": copy_into(own_buffers),',
      '"copy": copy_into(lambda layer: own[id(items[0])]),',
      ["tests/test_bench.py"],
      "the copy writes every layer into one buffer (a GPU's L2 absorbs the rewrites: the first run's copy)"),
    M("ctas-without-reserved-smem", "csrc/launch.cpp",
      "n = std::min<int64_t>(n, dev.smem_per_sm / (smem_bytes + dev.smem_reserved_per_cta));",
      "n = std::min<int64_t>(n, dev.smem_per_sm / smem_bytes);",
      ["harness --model"],
      "ctas_per_sm: the runtime's 1 KiB a CTA left out (7 CTAs of 32 KiB planned where 6 fit: a second wave)"),
    M("ctas-registers-unrounded", "csrc/launch.cpp",
      "const int regs_per_warp = (regs * 32 + 255) / 256 * 256;  // allocation unit: 256",
      "const int regs_per_warp = regs * 32;",
      ["harness --model"],
      "ctas_per_sm: registers counted per thread, not in a warp's 256-register units (too many CTAs planned "
      "at 84 registers or 100)"),
    M("row-stages-default-one", "csrc/launch.h",
      "  int row_stages = 2;",
      "  int row_stages = 1;",
      ["tests/test_launches.py::test_the_sweep_plans_reach_the_launches", "harness --model"],
      "row tiles back to one buffer by default (the plan of the first device run)"),
    M("row-lines-slot-ignores-sub", "csrc/tile_bodies.h",
      "slot = warp * subs + sub;",
      "slot = warp * subs;",
      ["harness --quick", "harness --model"],
      "Warp: every line group of a warp takes the warp's first line (a narrow line's neighbours in the warp never move)"),
    # ---- the device tooling (device/): its model, its readings, its crash handler
    M("model-ignores-card-sms", "device/model.py",
      "fig = {k: card.get(k) or v for k, v in H200.items()}",
      'fig = {k: v if k == "sms" else (card.get(k) or v) for k, v in H200.items()}',
      ["device/tests/test_perf_model.py::test_the_card_plans_the_launches_and_scales_the_copy"],
      "the model plans an H100 PCIe's launches for the H200's 132 SMs"),
    M("model-copy-unscaled", "device/model.py",
      'fig["copy_tbps"] *= fig["peak_tbps"] / H200["peak_tbps"]',
      'fig["copy_tbps"] *= 1.0',
      ["device/tests/test_perf_model.py::test_the_card_plans_the_launches_and_scales_the_copy"],
      "another card's copy predicted at the H200's bandwidth"),
    M("sweep-stops-at-failed-plan", "device/check.py",
      '"--json", out, env=env, check=False)',
      '"--json", out, env=env)',
      ["device/tests/test_check.py"],
      "a sweep plan that fails takes the later plans with it"),
    M("ncu-rates-unweighted", "device/check.py",
      'k: round(sum(launch.get(k, 0) * launch.get("duration_ns", 0) for launch in launches.values()) / ns, 1)',
      "k: round(sum(launch.get(k, 0) for launch in launches.values()) / len(launches), 1)",
      ["device/tests/test_check.py"],
      "ncu's DRAM throughput averaged over launches, not weighted by their time"),
    M("crash-handler-no-maps", "device/crash_handler.c",
      'const int maps = open("/proc/self/maps", O_RDONLY);',
      "const int maps = -1;",
      ["device/tests/test_crash_probe.py"],
      "the crash record leaves out the maps that place pc and si_addr"),
    M("crash-handler-stale-si-addr", "device/crash_handler.c",
      "say_num(\" si_addr \", (uintptr_t)info->si_addr, 1);",
      "say_num(\" si_addr \", pc, 1);",
      ["device/tests/test_crash_probe.py"],
      "the crash record's si_addr is not the faulting address"),
]
# fmt: on


def place(text, old, python=False):
    """The (start, end) spans of `text` holding `old`'s tokens in order,
    whitespace and comments between them ignored (a mutant's place survives
    clang-format, ruff format and reworded comments)."""
    comment = r"#[^\n]*" if python else r"//[^\n]*|/\*.*?\*/"
    code = re.sub(comment, " ", old, flags=re.S)
    tokens = re.findall(r"\w+|\S", code)
    gap = rf"(?:\s|{comment})*"
    pattern = gap.join(re.escape(t) for t in tokens)
    # An old text that starts with indentation takes the line's own, one that
    # ends with a newline the rest of its line: `new` is written as a whole.
    lead = r"(?m:^)[ \t]*" if old[:1] in " \t" else r"\b" if re.match(r"\w", tokens[0]) else ""
    trail = rf"[ \t]*(?:{comment})?\n" if old.endswith("\n") else r"\b" if re.match(r"\w", tokens[-1]) else ""
    return [m.span() for m in re.finditer(lead + pattern + trail, text, flags=re.S)]


def places(m, root):
    path = root / m.file
    return place(path.read_text(), m.old, m.file.endswith(".py")) if path.exists() else []


def log(msg):
    print(msg, flush=True)


def tree_files(src):
    """Tracked and untracked (not ignored) files of the tree at src."""
    out = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=src,
        check=True,
        capture_output=True,
    ).stdout
    return [f for f in out.decode().split("\0") if f and (src / f).is_file()]


def sync_tree(src, dst):
    """Copies src's files into dst, leaving identical files (and their
    timestamps, so ninja rebuilds nothing) alone; removes none. A copied
    file is stamped now: with its source's older time, ninja would take
    objects built from the copy's last version as up to date."""
    dst.mkdir(parents=True, exist_ok=True)
    changed = 0
    for f in tree_files(src):
        a, b = src / f, dst / f
        if b.exists() and b.read_bytes() == a.read_bytes():
            continue
        b.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(a, b)
        shutil.copymode(a, b)
        changed += 1
    return changed


class Builds:
    """The copy's native module (setup.py, in place) and harness (CMake), and
    snapshots of their object files and outputs to put back after a mutant."""

    def __init__(self, tree, python):
        self.tree, self.python = tree, python
        self.harness_dir = tree / "build" / "harness"
        self.snapshot_dir = tree / "build" / "mutants-snapshot"

    def build_extension(self):
        # --force: distutils would skip the build when only a header changed
        # (its check knows the .cpp files alone); ninja still recompiles only
        # what changed, and the link is seconds.
        env = dict(os.environ, MAX_JOBS=os.environ.get("MAX_JOBS", str(os.cpu_count() or 2)))
        return self._run([self.python, "setup.py", "-q", "build_ext", "--inplace", "--force"], env)

    def build_harness(self):
        # A build directory left by another venv names a ninja that may be gone: configure afresh.
        cache = self.harness_dir / "CMakeCache.txt"
        if cache.exists():
            tools = [
                line.split("=", 1)[1]
                for line in cache.read_text().splitlines()
                if line.startswith("CMAKE_MAKE_PROGRAM:")
            ]
            if tools and not Path(tools[0]).exists():
                shutil.rmtree(self.harness_dir)
        cmake = shutil.which("cmake", path=str(Path(self.python).parent)) or "cmake"
        if not (self.harness_dir / "build.ninja").exists():
            flags = "-G Ninja -DFLASHMLA_PERM_BUILD_EXTENSION=OFF -DCMAKE_BUILD_TYPE=RelWithDebInfo".split()
            ok, out = self._run([cmake, "-S", str(self.tree), "-B", str(self.harness_dir), *flags])
            if not ok:
                return ok, out
        return self._run([cmake, "--build", str(self.harness_dir), "--target", "tile_harness"])

    def build(self, tests):
        """Builds what `tests` run on (the module for pytest, the harness for
        "harness ..."): None, or what failed and its output's tail."""
        for what, needed, build in (
            ("native module", any(not t.startswith("harness") for t in tests), self.build_extension),
            ("harness", any(t.startswith("harness") for t in tests), self.build_harness),
        ):
            ok, out = build() if needed else (True, "")
            if not ok:
                return what, out[-4000:]
        return None

    def _run(self, cmd, env=None):
        env = dict(env or os.environ)
        env["PATH"] = str(Path(self.python).parent) + os.pathsep + env.get("PATH", "")  # the venv's ninja
        p = subprocess.run(cmd, cwd=self.tree, env=env, capture_output=True, text=True)
        return p.returncode == 0, p.stdout + p.stderr

    def outputs(self):
        """Build products whose content a mutant changes."""
        built = [
            p
            for p in (self.tree / "build").rglob("*")
            if self.snapshot_dir not in p.parents
            and p.is_file()
            and (p.suffix in (".o", ".so") or p.name == "tile_harness")
        ]
        return built + list((self.tree / "flashmla_perm").glob("_C*.so"))

    def snapshot(self):
        shutil.rmtree(self.snapshot_dir, ignore_errors=True)
        for p in self.outputs():
            q = self.snapshot_dir / p.relative_to(self.tree)
            q.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(p, q)

    def restore(self):
        """Puts back every output that differs from the snapshot (content and
        timestamp), so ninja sees the clean tree's objects as up to date."""
        for q in self.snapshot_dir.rglob("*"):
            if not q.is_file():
                continue
            p = self.tree / q.relative_to(self.snapshot_dir)
            s, t = q.stat(), p.stat() if p.exists() else None
            if t is None or (t.st_mtime_ns, t.st_size) != (s.st_mtime_ns, s.st_size):
                shutil.copy2(q, p)


def run_test(test, tree, python, timeout):
    """(passed, seconds, tail of the output, whether the time limit stopped it)."""
    start = time.time()
    if test.startswith("harness"):
        cmd = [str(tree / "build" / "harness" / "tile_harness")] + test.split()[1:]
    else:
        cmd = [python, "-m", "pytest", "-x", "-q", "-p", "no:cacheprovider", *test.split()]
    env = dict(
        os.environ,
        FLASHMLA_PERM_EXPECT_NATIVE="1",
        FLASHMLA_PERM_FUZZ_EXAMPLES=os.environ.get("FLASHMLA_PERM_FUZZ_EXAMPLES", "200"),
    )
    env.pop("FLASHMLA_PERM_FORCE_REFERENCE", None)
    try:
        p = subprocess.run(cmd, cwd=tree, env=env, capture_output=True, text=True, timeout=timeout)
        ok, out, hung = p.returncode == 0, p.stdout + p.stderr, False
        if p.returncode < 0:
            out += f"\n(killed by signal {-p.returncode})"
    except subprocess.TimeoutExpired as e:
        ok, out, hung = False, f"(timed out after {timeout}s)\n{e.stdout or ''}", True
    return ok, time.time() - start, "\n".join(out.strip().splitlines()[-15:]), hung


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("names", nargs="*", help="mutants to run (default: all)")
    ap.add_argument("--list", action="store_true", help="print the mutants and exit")
    ap.add_argument(
        "--check",
        action="store_true",
        help="check that each mutant's place occurs exactly once in its file, run nothing",
    )
    ap.add_argument("--source", default=str(ROOT), help="tree to copy (default: this one)")
    ap.add_argument("--workdir", default="/tmp/flashmla_perm_mutants")
    ap.add_argument("--python", default=sys.executable, help="python with torch (default: this one)")
    ap.add_argument(
        "--timeout",
        type=int,
        default=900,
        help="seconds per test run at most; with the baseline, a mutant's test gets "
        f"{HANG_FACTOR}x its clean run (at least {HANG_FLOOR_S}s), so a hang is called early",
    )
    ap.add_argument("--no-baseline", action="store_true", help="skip the clean run of the tests")
    ap.add_argument(
        "--all", action="store_true", help="run every listed test of a mutant, not only up to the first that kills it"
    )
    ap.add_argument("-v", "--verbose", action="store_true", help="print each killing test's output")
    args = ap.parse_args()

    chosen = [m for m in MUTANTS if not args.names or m.name in args.names]
    unknown = set(args.names) - {m.name for m in MUTANTS}
    if unknown:
        sys.exit(f"unknown mutants: {sorted(unknown)}")
    if args.list:
        for m in chosen:
            print(f"{m.name:32} {m.file:22} {', '.join(m.tests)}\n{'':32} {m.why}")
        return 0

    src, tree = Path(args.source).resolve(), Path(args.workdir).resolve() / "tree"
    if args.check:  # a formatter or an edit can leave a mutant with nothing to replace
        stale = [m.name for m in chosen if len(places(m, src)) != 1]
        print(f"mutants: {len(chosen) - len(stale)} of {len(chosen)} apply" + (f"; stale: {stale}" if stale else ""))
        return 1 if stale else 0

    def torch_says(condition):
        return (
            subprocess.run([args.python, "-c", f"import torch, sys; sys.exit(0 if {condition} else 1)"]).returncode == 0
        )

    cuda, cuda_build = torch_says("torch.cuda.is_available()"), torch_says("torch.version.cuda")
    t0 = time.time()
    log(f"== copying {src} to {tree} ({sync_tree(src, tree)} files changed)")
    builds, start = Builds(tree, args.python), time.time()
    all_tests = [t for m in chosen for t in m.tests]
    failed = builds.build(all_tests)
    if failed:
        log(failed[1])
        sys.exit(f"== the clean tree's {failed[0]} did not build")
    log(f"== the clean tree built in {time.time() - start:.0f}s")
    builds.snapshot()
    imported = subprocess.run(
        [args.python, "-c", "import flashmla_perm, sys; print(flashmla_perm.__file__)"],
        cwd=tree,
        capture_output=True,
        text=True,
    ).stdout.strip()
    if any(not t.startswith("harness") for t in all_tests) and not imported.startswith(str(tree)):
        sys.exit(f"== the copy imports flashmla_perm from {imported!r}, not from {tree}")

    # Each mutant's place, checked before anything runs.
    plans = []
    for m in chosen:
        count = len(places(m, tree))
        if count != 1:
            sys.exit(f"== mutant {m.name}: its code occurs {count} times in {m.file} (must be once): edit its old text")
        if m.needs_cuda and not cuda:
            plans.append((m, "needs a GPU (not run)"))
            continue
        if m.needs_cuda_build and not cuda_build:
            plans.append((m, "needs a CUDA torch's build (not run)"))
            continue
        plans.append((m, None))

    limit = {}  # test -> seconds a mutant's run of it may take
    if not args.no_baseline:
        tests = sorted({t for m, skip in plans if skip is None for t in m.tests})
        for t in tests:
            ok, secs, out, _ = run_test(t, tree, args.python, args.timeout)
            log(f"== baseline {t}: {'passed' if ok else 'FAILED'} ({secs:.0f}s)")
            if not ok:
                log(out)
                sys.exit("== a listed test fails on the clean tree: fix that first")
            limit[t] = min(args.timeout, max(HANG_FLOOR_S, int(HANG_FACTOR * secs)))

    rows, bad = [], 0
    for m, skip in plans:
        if skip:
            rows.append((m.name, m.file, skip, 0.0))
            log(f"-- {m.name}: {skip}")
            continue
        start = time.time()
        path = tree / m.file
        original, stat = path.read_text(), path.stat()
        ((lo, hi),) = places(m, tree)
        path.write_text(original[:lo] + m.new + original[hi:])
        try:
            failed = builds.build(m.tests)
            if failed:
                status = f"BUILD FAILED ({failed[0]})"
                log(failed[1][-3000:])
            else:
                killers = []
                for t in m.tests:
                    ok, secs, out, hung = run_test(t, tree, args.python, limit.get(t, args.timeout))
                    if not ok:
                        killers.append(t + (f" (a hang: timed out after {secs:.0f}s)" if hung else ""))
                        if args.verbose:
                            log(out)
                        if not args.all:
                            break
                status = f"killed by {', '.join(killers)}" if killers else "SURVIVED"
        finally:
            path.write_text(original)
            os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns))
            builds.restore()
        bad += not status.startswith("killed")
        rows.append((m.name, m.file, status, time.time() - start))
        log(f"-- {m.name}: {status} ({time.time() - start:.0f}s)")

    print()
    print("| mutant | file | result | seconds |\n| --- | --- | --- | --- |")
    for name, file, status, secs in rows:
        print(f"| {name} | {file} | {status} | {secs:.0f} |")
    killed = sum(status.startswith("killed") for _, _, status, _ in rows)
    print(
        f"\n{len(rows)} mutants: {killed} killed, {bad} not killed, {len(rows) - killed - bad} not run here"
        f" ({time.time() - t0:.0f}s in all)"
    )
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
