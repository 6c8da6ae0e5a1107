"""bench/norm_epilogue_trials.py's trial kernels compute what the engine's chain computes (so that a GPU
timing of them compares like with like): the o_proj GEMV with the residual + norm-prep epilogue, then the
gate|up GEMV over the prepared input, against the fp32 reference and the engine's kernels, with K across
chunks, both load schedules of the producer, and SwiGLU inside or apart."""

from __future__ import annotations

import pytest
import torch

from bench.norm_epilogue_trials import base_chain, reference, trial_chain, unfused_chain

# (hidden, attention width, intermediate, SwiGLU inside)
CASES = [(1100, 600, 24, True), (48, 40, 20, False), (520, 1030, 16, True)]
SCHEDULES = [{"BLOCK_K": 512, "PREFETCH": False}, {"BLOCK_K": 256, "PREFETCH": True}]


@pytest.mark.parametrize("schedule", SCHEDULES, ids=["plain", "prefetch"])
@pytest.mark.parametrize("case", CASES, ids=str)
def test_trial_chain_matches_the_reference_and_the_engines_chain(case, schedule, device):
    hidden, width, inter, swiglu = case
    torch.manual_seed(0)
    w_o = torch.randn(hidden, width, device=device) / width**0.5
    w_gate_up = torch.randn(2 * inter, hidden, device=device) / hidden**0.5
    a = torch.randn(1, width, device=device)
    residual = 3 * torch.randn(1, hidden, device=device)
    norm_weight = 1 + 0.3 * torch.randn(hidden, device=device)
    expected, expected_res = reference(a, w_o, residual, norm_weight, w_gate_up)
    out, new_res = trial_chain(a, w_o, residual, norm_weight, w_gate_up, swiglu, pdl=False, schedule=schedule)
    torch.testing.assert_close(new_res, expected_res, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(out, expected, atol=1e-5, rtol=1e-4)
    base, base_res = base_chain(a, w_o, residual, norm_weight, w_gate_up, swiglu)
    torch.testing.assert_close(out, base, atol=1e-5, rtol=1e-4)
    torch.testing.assert_close(new_res, base_res, atol=1e-5, rtol=1e-5)
    unfused, unfused_res = unfused_chain(a, w_o, residual, norm_weight, w_gate_up)
    torch.testing.assert_close(unfused, expected, atol=1e-5, rtol=1e-4)
    torch.testing.assert_close(unfused_res, expected_res, atol=1e-5, rtol=1e-5)
