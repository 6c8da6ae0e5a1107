"""The MoE kernels on a CUDA GPU at real layer shapes and the tiles the GPU takes (GPU only; skipped elsewhere):
the CPU tests run the interpreter's small tiles, these the heuristic's (or the tuned file's) at real widths, and
check that a captured CUDA graph serves any later routing."""

from __future__ import annotations

import pytest
import torch

from kernels.fused_moe import fused_experts, fused_experts_ref
from kernels.moe_router import moe_route, moe_route_ref

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")

# (E, K, H, I): Qwen3-30B-A3B, Qwen1.5-MoE-A2.7B, OLMoE-1B-7B, Mixtral-8x7B at TP=2
SHAPES = [(128, 8, 2048, 768), (60, 4, 2048, 1408), (64, 8, 2048, 1024), (8, 2, 4096, 7168)]


def layer(num_experts: int, hidden: int, inter: int, seed: int = 0):
    generator = torch.Generator(device="cuda").manual_seed(seed)
    w13 = (torch.randn(num_experts, 2 * inter, hidden, generator=generator, device="cuda") * hidden**-0.5).bfloat16()
    w2 = (torch.randn(num_experts, hidden, inter, generator=generator, device="cuda") * inter**-0.5).bfloat16()
    return w13, w2


def relative_error(x: torch.Tensor, ref: torch.Tensor) -> float:
    return float((x.float() - ref.float()).norm() / ref.float().norm())


@pytest.mark.parametrize("num_experts,top_k,hidden,inter", SHAPES)
def test_real_shapes_on_every_path_match_the_reference_in_bf16(num_experts, top_k, hidden, inter):
    w13, w2 = layer(num_experts, hidden, inter)
    for num_tokens in (1, 5, 64, 700):
        x = torch.randn(num_tokens, hidden, device="cuda").bfloat16()
        weights, ids = moe_route(torch.randn(num_tokens, num_experts, device="cuda"), top_k, True)
        reference = fused_experts_ref(x, w13, w2, weights, ids)
        for path in ("gemv", "grouped"):
            got = fused_experts(x, w13, w2, weights, ids, tiles={"path": path})
            assert relative_error(got, reference) < 1e-2, (num_tokens, path)
        assert relative_error(fused_experts(x, w13, w2, weights, ids), reference) < 1e-2


def test_router_at_8192_tokens_and_128_experts():
    logits = torch.randn(8192, 128, device="cuda")
    weights, ids = moe_route(logits, 8, True)
    expected_weights, expected_ids = moe_route_ref(logits, 8, True)
    assert (ids == expected_ids).float().mean() > 0.999  # random fp32 logits: ties are vanishingly rare
    torch.testing.assert_close(weights.sort(-1).values, expected_weights.sort(-1).values, atol=1e-6, rtol=1e-5)


@pytest.mark.parametrize("num_tokens", [1, 48, 300])
def test_a_captured_graph_serves_later_routings_as_eager_calls_do(num_tokens):
    num_experts, top_k, hidden, inter = 60, 4, 2048, 1408
    w13, w2 = layer(num_experts, hidden, inter)
    x = torch.randn(num_tokens, hidden, device="cuda").bfloat16()
    logits = torch.randn(num_tokens, num_experts, device="cuda")

    def step():
        weights, ids = moe_route(logits, top_k, False)
        return fused_experts(x, w13, w2, weights, ids)

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        step()  # compiles outside the capture
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, stream=side):
        out = step()
    for seed in range(3):  # new routings (skewed in the last) through the same graph
        generator = torch.Generator(device="cuda").manual_seed(seed)
        logits.copy_(torch.randn(logits.shape, generator=generator, device="cuda"))
        if seed == 2:
            logits[:, 7] += 100.0  # every token routes to expert 7 (and three others)
        x.copy_(torch.randn(x.shape, generator=generator, device="cuda"))
        graph.replay()
        torch.cuda.synchronize()
        assert torch.equal(out, step()), f"routing {seed}"
