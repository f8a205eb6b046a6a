"""The benchmark's in-place baselines (bench/bench_load_time.py BASELINES):
they stream every byte and change none, in place or into a buffer."""

import os
import sys

import pytest
import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "bench"))
import bench_load_time as bench  # noqa: E402


@pytest.mark.parametrize("nbytes,dtype", [(4096, torch.int64), (4092, torch.int32), (4094, torch.int16),
                                          (4095, torch.uint8)])
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
    bench.stream_into(buffers)(layer)
    for b, t, buf in zip(before, layer, buffers):
        assert torch.equal(bench.as_bytes(t), b) and torch.equal(buf, b)
    assert bench.available_backends(bench.parse_args(["--backends", "inplace,outofplace"])) == ["inplace",
                                                                                                  "outofplace"]
