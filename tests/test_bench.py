"""The benchmark's copy and baselines (bench/bench_load_time.py): the copy
writes each layer into buffers of its own; the baselines (BASELINES) stream
every byte and change none, in place, into each layer's buffers, or into one
set of buffers every layer reuses."""

import os
import sys

import pytest
import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "bench"))
import bench_load_time as bench  # noqa: E402


@pytest.mark.parametrize(
    "nbytes,dtype", [(4096, torch.int64), (4092, torch.int32), (4094, torch.int16), (4095, torch.uint8)]
)
def test_words_tile_the_storage(nbytes, dtype):
    t = torch.empty(nbytes, dtype=torch.uint8).random_(0, 256)
    w = bench.words(t)
    assert w.dtype == dtype and w.numel() * w.element_size() == nbytes and w.data_ptr() == t.data_ptr()


def test_baselines_stream_the_bytes_and_change_none():
    model = bench.parse_args(["--tp", "8"])
    layer = bench.make_layer(model, "wo_a", 8, "cpu")
    before = [bench.as_bytes(t).clone() for t in layer]
    buffers = [torch.full((bench.tensors_bytes([t]),), 0xA5, dtype=torch.uint8) for t in layer]  # poisoned
    bench.stream_in_place(layer)
    bench.stream_into(lambda _: buffers)(layer)
    for b, t, buf in zip(before, layer, buffers):
        assert torch.equal(bench.as_bytes(t), b) and torch.equal(buf, b)
    names = ["inplace", "outofplace", "copy_1buf"]
    assert bench.available_backends(bench.parse_args(["--backends", ",".join(names)])) == names


@pytest.mark.parametrize("kind", ["wq_b", "wv_packed"])
def test_copy_writes_each_layer_into_buffers_of_its_own(kind, monkeypatch):
    """The copy a load is measured against: each layer's bytes land in
    buffers that no other layer's copy writes (on a GPU, rewrites of one
    buffer would stay in its L2); outofplace the same; copy_1buf into one
    set that every layer reuses."""
    made = []  # every set of per-layer buffers the case makes
    real = bench.layer_buffers
    monkeypatch.setattr(bench, "layer_buffers", lambda layers, device: made.append(real(layers, device)) or made[-1])
    args = bench.parse_args(["--tp", "8"])
    case = bench.make_case(args, kind, 8, "cpu", ["copy_1buf", "outofplace"], 3)
    own, shared = made[0], made[1][id(case.items[0])]
    assert len(made) == 2 and len(own) == 3
    for name in ("copy", "outofplace", "copy_1buf"):
        for bufs in [*own.values(), shared]:  # poisoned again: a byte not written shows
            for b in bufs:
                b.fill_(0xA5)
        for layer in case.items:
            case.fns[name](layer)
            dests = shared if name == "copy_1buf" else own[id(layer)]
            assert all(torch.equal(d, bench.as_bytes(t)) for d, t in zip(dests, layer)), (name, "bytes")
        if name != "copy_1buf":  # every layer's bytes are still there after the pass
            for layer in case.items:
                assert all(torch.equal(d, bench.as_bytes(t)) for d, t in zip(own[id(layer)], layer)), name
    ptrs = [b.data_ptr() for bufs in [*own.values(), shared] for b in bufs]
    assert len(set(ptrs)) == len(ptrs) == 8


def test_the_device_check_asks_for_the_benchmarks_baselines():
    # Two files name them (the device check runs without torch, so it cannot
    # import the benchmark): a baseline added to one alone would be timed
    # and never read, or asked for and never timed.
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "device"))
    import check

    assert check.BENCH_BASELINES == bench.BASELINES
