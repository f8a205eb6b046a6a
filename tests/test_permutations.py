"""Permutation builders against the closed forms of docs/design.md, written here
as plain loops (no shared code with the builders)."""

import pytest
import torch

import flashmla_perm as fp
from flashmla_perm import reference as ref


def q_closed_form(H, D):
    perm = [None] * (H * D)
    for h in range(H):
        for d in range(D):
            perm[(d // 16) * (H * 16) + h * 16 + d % 16] = h * D + d
    return perm


def o_closed_form(G, D):
    perm = [None] * (G * D)
    for h in range(G):
        for c in range(D // 32):
            for j in range(32):
                perm[(c * G + h) * 32 + j] = h * D + c * 32 + j
    return perm


@pytest.mark.parametrize("H", [1, 2, 3, 8, 16, 64, 128])
@pytest.mark.parametrize("D", [16, 32, 256, 512])
def test_q_permutation(H, D):
    perm = fp.q_fused_permutation(H, D)
    assert perm.dtype == torch.long and perm.shape == (H * D,)
    assert perm.tolist() == q_closed_form(H, D)


@pytest.mark.parametrize("G", [1, 2, 8, 16])
@pytest.mark.parametrize("D", [32, 64, 256, 512])
def test_o_permutations(G, D):
    perm = fp.o_fused_permutation(G, D)
    assert perm.tolist() == o_closed_form(G, D)
    chunks = fp.o_fused_chunk_permutation(G, D)
    assert chunks.tolist() == [p // 32 for p in o_closed_form(G, D)[::32]]


def test_defaults_match_the_model():
    assert (fp.HEAD_DIM, fp.Q_CHUNK, fp.O_CHUNK, fp.WV_GROUP_SIZE) == (512, 16, 32, 8)
    assert torch.equal(fp.o_fused_permutation(), fp.o_fused_permutation(8, 512))
    assert torch.equal(fp.q_fused_permutation(64), fp.q_fused_permutation(64, 512))


def test_q_permutation_on_blocks_is_a_grid_transpose():
    H, D = 64, 512
    blocks = fp.q_fused_permutation(H, D).view(-1, 16)
    assert torch.equal(blocks - blocks[:, :1], torch.arange(16).expand_as(blocks))
    grid = (blocks[:, 0] // 16).view(D // 16, H)  # fused block (c, h) <- standard block (h, c)
    assert torch.equal(grid, torch.arange(H * D // 16).view(H, D // 16).t())


@pytest.mark.parametrize("n", [1, 2, 17, 1000])
def test_inverse_permutation(n):
    perm = torch.randperm(n)
    inv = fp.inverse_permutation(perm)
    assert torch.equal(perm[inv], torch.arange(n))
    assert torch.equal(inv[perm], torch.arange(n))
    assert fp.inverse_permutation is ref.inverse_permutation
