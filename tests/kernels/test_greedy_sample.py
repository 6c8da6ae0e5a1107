"""Greedy sampling kernel against torch.argmax and isfinite: first index on ties, every
chunk count, non-finite rows flagged."""

from __future__ import annotations

import pytest
import torch

from kernels.greedy_sample import BLOCK_V, greedy_sample, greedy_sample_ref

ON_GPU = torch.cuda.is_available()
# (rows, vocab): one row, a vocab that is not a multiple of the tile, more chunks than rows
SHAPES = [(1, 100), (3, 2 * BLOCK_V + 5), (5, 3 * BLOCK_V)]
if ON_GPU:
    SHAPES += [(1, 128256), (256, 151936), (17, 50257)]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16], ids=str)
@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_greedy_sample_matches_argmax(shape, dtype, device):
    logits = torch.randn(*shape, device=device).to(dtype)
    for chunks in sorted({None, 1, -(-shape[1] // BLOCK_V)}, key=lambda c: c or 0):
        torch.testing.assert_close(greedy_sample(logits, chunks=chunks), greedy_sample_ref(logits), atol=0, rtol=0)


def test_ties_go_to_the_first_index_across_chunks(device):
    logits = torch.zeros(2, 3 * BLOCK_V + 1, device=device)
    logits[0, [7, BLOCK_V + 3, 3 * BLOCK_V]] = 5.0  # equal maxima in three chunks
    logits[1, [3 * BLOCK_V, 2 * BLOCK_V + 1]] = 2.0
    out = greedy_sample(logits, chunks=3)
    assert out[0].tolist() == [7, 2 * BLOCK_V + 1]
    assert out.tolist() == greedy_sample_ref(logits).tolist()


def test_non_finite_rows_are_flagged(device):
    logits = torch.randn(4, 2 * BLOCK_V + 9, device=device)
    logits[1, 5] = float("nan")
    logits[2, 2 * BLOCK_V + 8] = float("inf")
    logits[3] = float("-inf")
    out = greedy_sample(logits, chunks=2)
    assert out[1].tolist() == [1, 0, 0, 0]
    assert out[0, 0] == logits[0].argmax()
    for _ in range(2):  # the row counters went back to zero: a second call merges again
        assert greedy_sample(logits, chunks=2)[1].tolist() == [1, 0, 0, 0]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_masked_rows_take_minus_inf_as_a_forbidden_token(dtype, device):
    """masked=True (a grammar's bitmask went over the logits): -inf is no fault, the argmax skips it; NaN,
    +inf and a row with no finite logit still are."""
    vocab = 2 * BLOCK_V + 9
    logits = torch.randn(5, vocab, device=device)
    logits[:, ::3] = float("-inf")  # every row masked in part, the first chunk's maximum among them
    logits[:, 0] = 50.0
    logits[:, 0] = float("-inf")
    logits[1, 7] = float("nan")
    logits[2, 2 * BLOCK_V + 8] = float("inf")
    logits[3] = float("-inf")
    logits = logits.to(dtype)
    want_tokens = logits[0].float().argmax().item(), logits[4].float().argmax().item()
    for chunks in (1, 2, 3):
        out = greedy_sample(logits, masked=True, chunks=chunks)
        assert out[1].tolist() == [1, 0, 0, 0, 1]
        assert (out[0, 0].item(), out[0, 4].item()) == want_tokens
        ref = greedy_sample_ref(logits, masked=True)
        assert ref[1].tolist() == out[1].tolist() and ref[0, [0, 4]].tolist() == list(want_tokens)
    assert greedy_sample(logits, chunks=2)[1].tolist() == [0, 0, 0, 0, 0]  # unmasked: -inf is a fault


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=str)
def test_16_bit_logits_whose_sum_overflows_their_dtype_are_finite(dtype, device):
    """The engine samples greedy rows from the LM head's 16-bit output (LMHead, widen=False): a row of
    large finite logits is finite although its sum overflows fp16 (not bf16, whose range is fp32's); a row
    with an infinity is not."""
    logits = torch.full((2, 2 * BLOCK_V + 3), 60000.0, device=device).to(dtype)
    logits[0, BLOCK_V + 1] = 65000.0
    logits[1, 4] = float("inf")
    expected = [[BLOCK_V + 1, 4], [1, 0]]
    assert greedy_sample_ref(logits).tolist() == expected
    assert greedy_sample(logits, chunks=2).tolist() == expected


def test_greedy_sample_rejects_a_bad_chunk_count(device):
    with pytest.raises(ValueError, match="chunks must be in"):
        greedy_sample(torch.zeros(1, 10, device=device), chunks=2)


@pytest.mark.skipif(not ON_GPU, reason="counts compiled GPU kernels")
def test_one_compiled_variant_for_every_batch_size(device):
    """Batch and chunk counts change every step: they must not be compile-time constants
    (a variant per value recompiled the kernel dozens of times in one offline run)."""
    from kernels.greedy_sample import _greedy_kernel

    kernel_cache = _greedy_kernel.device_caches[torch.cuda.current_device()][0]
    greedy_sample(torch.randn(1, 151936, device=device))
    variants = len(kernel_cache)  # other tests of this process compiled other dtypes and strides
    for rows in (2, 3, 7, 16, 33, 100, 256):
        greedy_sample(torch.randn(rows, 151936, device=device))
    assert len(kernel_cache) == variants
