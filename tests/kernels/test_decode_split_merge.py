"""The merge of flash-decoding's split parts (kernels/decode_split_merge.py) against its torch formula: split
counts off the chunk sizes, head dims below their padded width, parts of splits without keys (lse -inf)
and rows whose splits all lack keys (output 0), bad input refused, and the rule that picks the merge.
Both merges inside decode attention are tested in tests/kernels/test_attention.py."""

from __future__ import annotations

import pytest
import torch

from kernels.decode_split_merge import choose_merge, merge_splits, merge_splits_ref

# (S, Hq, P, D): P off the powers of two and past one chunk of the merge's loads (P_CHUNK)
CASES = [(1, 4, 3, 64), (2, 3, 33, 80), (3, 2, 64, 128), (1, 8, 7, 256)]
DTYPES = [torch.float32, torch.bfloat16]


def _parts(case, device):
    num_seqs, num_heads, num_splits, head_dim = case
    block_d = max(16, 1 << (head_dim - 1).bit_length())
    part_out = torch.randn(num_seqs, num_heads, num_splits, block_d, device=device)
    part_lse = 4 * torch.randn(num_seqs, num_heads, num_splits, device=device)
    part_lse[..., 1::3] = float("-inf")  # splits that held no keys
    part_lse[0, 0] = float("-inf")  # a row of no keys at all
    return part_out, part_lse


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("case", CASES, ids=str)
def test_merge_matches_its_formula(case, dtype, device):
    num_seqs, num_heads, _, head_dim = case
    part_out, part_lse = _parts(case, device)
    out = torch.full((num_seqs, num_heads, head_dim), float("nan"), dtype=dtype, device=device)
    merge_splits(part_out, part_lse, out)
    expected = merge_splits_ref(part_out, part_lse, head_dim)
    tol = dict(atol=1e-5, rtol=1e-5) if dtype == torch.float32 else dict(atol=2e-2, rtol=2e-2)
    torch.testing.assert_close(out.float(), expected, **tol)
    assert torch.equal(out[0, 0], torch.zeros_like(out[0, 0]))  # every split empty: 0, not NaN
    assert not torch.equal(out[-1, -1], torch.zeros_like(out[-1, -1]))


def test_merge_refuses_what_it_does_not_do(device):
    part_out, part_lse = _parts((1, 2, 5, 64), device)
    out = torch.empty(1, 2, 64, device=device)
    with pytest.raises(ValueError, match="float32"):
        merge_splits(part_out.half(), part_lse, out)
    with pytest.raises(ValueError, match=r"\[S, Hq, P\]"):
        merge_splits(part_out, part_lse[:, :, :4], out)
    with pytest.raises(ValueError, match="power of two"):
        merge_splits(part_out, part_lse, torch.empty(1, 2, 80, device=device))
    with pytest.raises(ValueError, match="contiguous"):
        merge_splits(part_out, part_lse, torch.empty(1, 64, 2, device=device).transpose(1, 2))


def test_the_merge_is_a_second_kernel_up_to_head_dim_128():
    assert [choose_merge(d) for d in (32, 64, 80, 128, 256)] == ["kernel"] * 4 + ["last_split"]
