"""Token bitmask kernel against its torch reference and against a mask built bit by bit: a vocabulary that is
not a multiple of 32 (nor of the kernel's tile), rows with and without a constraint, a mask narrower than
the logits (a model vocabulary wider than the tokenizer's)."""

from __future__ import annotations

import pytest
import torch

from kernels.token_bitmask import BLOCK_V, apply_token_bitmask, apply_token_bitmask_ref


def _bitmask(allowed: torch.Tensor, num_words: int) -> torch.Tensor:
    """[S, V] bool -> [S, num_words] int32, bit v % 32 of word v // 32 set where allowed."""
    rows, vocab = allowed.shape
    words = torch.zeros(rows, num_words, dtype=torch.int64)
    for v in range(min(vocab, num_words * 32)):
        words[:, v // 32] |= allowed[:, v].long() << (v % 32)
    return (words - ((words >> 31) & 1) * (1 << 32)).to(torch.int32)  # two's complement of bit 31


@pytest.mark.parametrize("vocab,num_words", [(77, 3), (BLOCK_V + 45, -(-(BLOCK_V + 45) // 32)), (100, 2)])
def test_kernel_matches_ref_and_the_bits(vocab, num_words, device):
    torch.manual_seed(0)
    allowed = torch.rand(4, vocab) < 0.3
    bitmask = _bitmask(allowed, num_words).to(device)
    logits = torch.randn(4, vocab, device=device)
    rows = torch.tensor([0, 2, 3], dtype=torch.int32, device=device)  # row 1 carries no constraint
    got = apply_token_bitmask(logits.clone(), bitmask, rows)
    want = apply_token_bitmask_ref(logits.clone(), bitmask, rows)
    torch.testing.assert_close(got, want, atol=0, rtol=0)
    expect = logits.clone().cpu()
    covered = torch.zeros(vocab, dtype=torch.bool)
    covered[: num_words * 32] = True
    for row in (0, 2, 3):
        expect[row] = expect[row].masked_fill(~(allowed[row] & covered), float("-inf"))
    torch.testing.assert_close(got.cpu(), expect, atol=0, rtol=0)
    assert torch.equal(got[1], logits[1])  # untouched


def test_no_rows_leaves_the_logits(device):
    logits = torch.randn(2, 40, device=device)
    out = apply_token_bitmask(logits.clone(), torch.zeros(2, 2, dtype=torch.int32, device=device),
                              torch.zeros(0, dtype=torch.int32, device=device))  # fmt: skip
    assert torch.equal(out, logits)


def test_launcher_names_bad_arguments(device):
    logits = torch.randn(2, 40, device=device)
    with pytest.raises(ValueError, match="bitmask"):
        apply_token_bitmask(logits, torch.zeros(2, 2, dtype=torch.int64, device=device),
                            torch.zeros(1, dtype=torch.int32, device=device))  # fmt: skip
    with pytest.raises(ValueError, match="rows"):
        apply_token_bitmask(logits, torch.zeros(2, 2, dtype=torch.int32, device=device),
                            torch.zeros(1, dtype=torch.int64, device=device))  # fmt: skip
