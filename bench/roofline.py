"""The floor of a workload: bytes and FLOPs of each step it needs, against the ceilings.

For one forward step over a batch:

    bytes = W + kv * (sum of context lengths read + new tokens written)
    flops = 2 * P * T + 2 * V * H * R + 4 * L * Hq * D * (sum over new tokens of the keys each attends to)
    time  = max(bytes / read_bandwidth, flops / matmul_rate)

where W = weight bytes streamed per step (every parameter except the input embedding table of an
untied model, of which a step reads only its tokens' rows; a tied table counts once, as the LM
head), kv = K + V bytes of one token over all layers, P = parameters of the per-token projections
(all but the embedding table and the LM head), T = new tokens, R = rows that sample, V x H = the
LM head, L = layers, Hq = query heads, D = head dim. Activations are left out (a few MB per
step against GBs of weights and K/V).

The workload's floor is the sum over the steps it needs, on the ideal schedule: every prompt
prefilled first, packed into steps of at most `max_num_batched_tokens` tokens (a prompt may be
split across steps; the step that ends a prompt samples its first output token), then one
decode step per further output token, each over every sequence that still needs one. A
sequence of prompt p and output o needs o - 1 decode steps; in decode step k (k = 1, 2, ...) it
reads p + k - 1 cached tokens plus the one it writes (p + k keys).

Batch-1 decode uses the same per-step formula with T = R = 1.

Sliding-window layers (Ls of the L layers with a window of Wn keys: Mistral, Qwen2's upper layers, five of six
Gemma 3 layers) read and attend to at most Wn keys of a sequence, whatever its length c: every key count above
is each sequence's effective count, (L - Ls) / L * c + Ls / L * min(c, Wn), so that kv and 4 L Hq D keep their
meaning (all layers). A decode step given only the sum of its lengths (decode_step_floor) takes them equal.

MoE models (routed experts of E per layer, K per token) read and multiply only the experts their
tokens pick: of the experts' bytes X (and parameters Px), a step of T tokens reads the expected
touched share f(T) = 1 - (1 - K/E)^T (each token picks K distinct experts, uniformly: the random
weights' routing; K/E at one token, nearly all of them at a few hundred), and each token
multiplies K/E of Px (its active parameters):

    bytes = W - X + f(T) X + kv * (...)        flops = 2 * (P - Px + Px K / E) * T + ...
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

import numpy as np
import torch


@dataclass(frozen=True)
class ModelCosts:
    """Per-step cost coefficients of one model (see the module docstring for the symbols)."""

    weight_bytes: int  # W
    all_param_bytes: int  # every parameter once (BENCHMARKS.md's "weights" figures)
    projection_params: int  # P
    lm_head_params: int  # V * H
    kv_bytes_per_token: int  # kv
    attention_flops_per_key: int  # 4 * L * Hq * D
    expert_bytes: int = 0  # X: the routed experts' weights, all layers (0: a dense model)
    expert_params: int = 0  # Px
    num_experts: int = 0  # E
    top_k: int = 0  # K
    num_layers: int = 0  # L (0: no sliding layers counted)
    sliding_layers: int = 0  # Ls
    sliding_window: int = 0  # Wn

    @classmethod
    def from_model(cls, model: torch.nn.Module, hf_config: Any) -> ModelCosts:
        """From an engine model (engine/models) and its transformers config."""
        params = dict(model.named_parameters())  # tied tensors appear once
        itemsize = next(iter(params.values())).element_size()
        total = sum(p.numel() for p in params.values())
        embed = sum(p.numel() for name, p in params.items() if "embed_tokens" in name or name.endswith("wte.weight"))
        vocab, hidden = int(hf_config.vocab_size), int(getattr(hf_config, "hidden_size", 0) or hf_config.n_embd)
        tied = bool(getattr(hf_config, "tie_word_embeddings", False))
        layers, heads, head_dim = model.num_layers, model.num_kv_heads, model.head_dim
        q_heads = int(getattr(hf_config, "num_attention_heads", 0) or hf_config.n_head)
        # the packed routed experts of an MoE model (engine/models/layers/fused_moe.py)
        experts = sum(p.numel() for name, p in params.items() if name.endswith((".experts.gate_up_proj",
                                                                                 ".experts.down_proj")))  # fmt: skip
        spec = getattr(model, "moe", None)
        from engine.models.layers.attention import PagedAttention
        from engine.quantization.quantized_weight import QuantizedWeight

        windows = [m.sliding_window for m in model.modules() if isinstance(m, PagedAttention) and m.sliding_window]
        # quantized linear layers hold buffers, not parameters: their codes and scales are what a step streams
        quantized = [m for m in model.modules() if isinstance(m, QuantizedWeight)]
        quantized_bytes = sum(b.numel() * b.element_size() for m in quantized for b in m.buffers())
        quantized_params = sum(m.num_in * m.num_out for m in quantized)
        return cls(
            weight_bytes=(total - (0 if tied else embed)) * itemsize + quantized_bytes,
            all_param_bytes=total * itemsize + quantized_bytes,
            projection_params=total - embed - (0 if tied else vocab * hidden) + quantized_params,
            lm_head_params=vocab * hidden,
            kv_bytes_per_token=2 * layers * heads * head_dim * itemsize,
            attention_flops_per_key=4 * layers * q_heads * head_dim,
            expert_bytes=experts * itemsize,
            expert_params=experts,
            num_experts=spec.num_experts if experts else 0,
            top_k=spec.top_k if experts else 0,
            num_layers=layers,
            sliding_layers=len(windows),
            sliding_window=max(windows, default=0),  # one window a model (Gemma 3's, Mistral's, Qwen2's)
        )

    def effective_keys(self, context: np.ndarray | float) -> np.ndarray | float:
        """Each sequence's keys as all layers see them: c where no layer has a window (see the docstring)."""
        if not self.sliding_layers:
            return context
        share = self.sliding_layers / self.num_layers
        return (1 - share) * context + share * np.minimum(context, self.sliding_window)

    def effective_key_sum(self, first: int, last: int) -> float:
        """Sum of effective_keys(c) for c = first .. last (the keys each token of a prefill chunk attends to)."""
        if last < first:
            return 0.0
        total = (first + last) * (last - first + 1) / 2
        if not self.sliding_layers:
            return total
        window = self.sliding_window
        capped_from = max(first, window + 1)  # c above the window counts Wn
        below = min(last, window)
        windowed = (first + below) * (below - first + 1) / 2 if below >= first else 0.0
        windowed += window * max(0, last - capped_from + 1)
        share = self.sliding_layers / self.num_layers
        return (1 - share) * total + share * windowed

    def touched_expert_share(self, new_tokens: float) -> float:
        """f(T): the expected share of the experts' weights a step of T tokens reads (1 for a dense model)."""
        if not self.num_experts:
            return 1.0
        return 1.0 - (1.0 - self.top_k / self.num_experts) ** new_tokens

    def step_weight_bytes(self, new_tokens: float) -> float:
        """W - X + f(T) X: the weights a step of T tokens streams."""
        return self.weight_bytes - self.expert_bytes + self.touched_expert_share(new_tokens) * self.expert_bytes

    def active_projection_params(self) -> float:
        """P - Px + Px K / E: the projection parameters each token multiplies."""
        if not self.num_experts:
            return float(self.projection_params)
        return self.projection_params - self.expert_params + self.expert_params * self.top_k / self.num_experts

    def as_dict(self) -> dict:
        return asdict(self)


def step_cost(
    costs: ModelCosts, new_tokens: int, sampled_rows: int, keys_read: float, keys_attended: float
) -> tuple[float, float]:
    """(bytes, flops) of one step.

    Args:
        new_tokens: T.
        sampled_rows: R.
        keys_read: cached tokens whose K/V the step reads (sum over sequences).
        keys_attended: sum over new tokens of the keys each attends to (itself included).
    """
    nbytes = costs.step_weight_bytes(new_tokens) + costs.kv_bytes_per_token * (keys_read + new_tokens)
    flops = (
        2 * costs.active_projection_params() * new_tokens
        + 2 * costs.lm_head_params * sampled_rows
        + costs.attention_flops_per_key * keys_attended
    )
    return float(nbytes), float(flops)


def step_seconds(nbytes: float, flops: float, read_gbps: float, matmul_tflops: float) -> float:
    return max(nbytes / (read_gbps * 1e9), flops / (matmul_tflops * 1e12))


def workload_floor(
    costs: ModelCosts,
    prompt_lens: list[int],
    output_lens: list[int],
    max_num_batched_tokens: int,
    read_gbps: float,
    matmul_tflops: float,
) -> dict:
    """The workload's floor on the ideal schedule (module docstring): seconds and its parts."""
    prefill_s = prefill_bytes = prefill_flops = 0.0
    budget, step = max_num_batched_tokens, [0.0, 0.0, 0.0, 0.0]  # tokens, rows, keys read, keys attended
    num_prefill_steps = 0

    def close_step() -> None:
        nonlocal prefill_s, prefill_bytes, prefill_flops, num_prefill_steps
        nbytes, flops = step_cost(costs, int(step[0]), int(step[1]), step[2], step[3])
        prefill_s += step_seconds(nbytes, flops, read_gbps, matmul_tflops)
        prefill_bytes += nbytes
        prefill_flops += flops
        num_prefill_steps += 1

    for p in prompt_lens:
        done = 0
        while done < p:
            take = min(p - done, budget - int(step[0]))
            # chunk [done, done + take): reads `done` cached keys; token i attends to i + 1 keys
            step[0] += take
            step[2] += float(costs.effective_keys(done))
            step[3] += costs.effective_key_sum(done + 1, done + take)
            done += take
            if done == p:
                step[1] += 1
            if step[0] >= budget:
                close_step()
                step = [0.0, 0.0, 0.0, 0.0]
    if step[0]:
        close_step()

    prompts = np.asarray(prompt_lens, dtype=np.float64)
    outputs = np.asarray(output_lens, dtype=np.int64)
    decode_s = decode_bytes = decode_flops = 0.0
    num_decode_steps = int(outputs.max()) - 1 if len(outputs) else 0
    for k in range(1, num_decode_steps + 1):
        active = outputs > k
        batch = int(active.sum())
        # p + k keys attended, p + k - 1 of them read from the cache (each sequence's effective count)
        keys = float(costs.effective_keys(prompts[active] + k).sum())
        read = float(costs.effective_keys(prompts[active] + k - 1).sum())
        nbytes, flops = step_cost(costs, batch, batch, read, keys)
        decode_s += step_seconds(nbytes, flops, read_gbps, matmul_tflops)
        decode_bytes += nbytes
        decode_flops += flops
    return {
        "floor_s": prefill_s + decode_s,
        "prefill_floor_s": prefill_s,
        "decode_floor_s": decode_s,
        "num_prefill_steps": num_prefill_steps,
        "num_decode_steps": num_decode_steps,
        "bytes": prefill_bytes + decode_bytes,
        "flops": prefill_flops + decode_flops,
    }


def decode_step_floor(costs: ModelCosts, num_seqs: int, context_tokens: float, read_gbps: float,
                      matmul_tflops: float) -> float:  # fmt: skip
    """Seconds of a decode step of num_seqs sequences whose lengths (the new token included) sum to
    context_tokens: the step the engine ran, as engine.step_timer records it (lengths taken equal for windows)."""
    mean = context_tokens / max(num_seqs, 1)
    keys = float(costs.effective_keys(mean)) * num_seqs
    read = float(costs.effective_keys(mean - 1)) * num_seqs
    nbytes, flops = step_cost(costs, num_seqs, num_seqs, read, keys)
    return step_seconds(nbytes, flops, read_gbps, matmul_tflops)


def decode_token_floor(costs: ModelCosts, context_len: float, read_gbps: float, matmul_tflops: float) -> float:
    """Seconds of one batch-1 decode step reading `context_len` cached tokens."""
    read, keys = float(costs.effective_keys(context_len)), float(costs.effective_keys(context_len + 1))
    nbytes, flops = step_cost(costs, 1, 1, read, keys)
    return step_seconds(nbytes, flops, read_gbps, matmul_tflops)


def check_arithmetic() -> None:
    """Hand-computed cases of the formulas above (runs at the start of every benchmark)."""
    costs = ModelCosts(
        weight_bytes=1000,
        all_param_bytes=1200,
        projection_params=10,
        lm_head_params=5,
        kv_bytes_per_token=2,
        attention_flops_per_key=4,
    )
    assert step_cost(costs, 1, 1, 7, 8) == (1000 + 2 * 8, 2 * 10 + 2 * 5 + 4 * 8)
    # One prompt of 3 split 2 + 1 over budget-2 steps, output 3 (2 decode steps of 1 sequence).
    floor = workload_floor(costs, [3], [3], 2, read_gbps=1e-9, matmul_tflops=1e-12)  # 1 byte/s, 1 flop/s
    # prefill step 1: T=2, R=0, read 0, attended 1+2 = 3 -> bytes 1004, flops 40 + 12 = 52
    # prefill step 2: T=1, R=1, read 2, attended 3 -> bytes 1006, flops 20 + 10 + 12 = 42
    # decode k=1: keys 4 -> bytes 1000 + 2*4 = 1008; k=2: keys 5 -> 1010
    assert floor["num_prefill_steps"] == 2 and floor["num_decode_steps"] == 2
    assert floor["prefill_floor_s"] == 1004 + 1006
    assert floor["decode_floor_s"] == 1008 + 1010
    # MoE: of 1000 weight bytes 800 are experts (8 of them, 2 per token), of 10 projection params 8
    moe = ModelCosts(**{**costs.as_dict(), "expert_bytes": 800, "expert_params": 8, "num_experts": 8, "top_k": 2})
    # one token reads 2/8 of the experts: 200 + 800 / 4 = 400 bytes; multiplies 2 + 8 / 4 = 4 params
    assert step_cost(moe, 1, 1, 7, 8) == (400 + 2 * 8, 2 * 4 + 2 * 5 + 4 * 8)
    # two tokens: 1 - (3/4)^2 = 7/16 of the experts: 200 + 350 bytes; flops per token unchanged
    assert step_cost(moe, 2, 2, 0, 3) == (550 + 2 * 2, 2 * 4 * 2 + 2 * 5 * 2 + 4 * 3)
    # windows: 2 of 4 layers see at most 3 keys. A sequence of 10 keys counts 1/2 * 10 + 1/2 * 3 = 6.5
    windowed = ModelCosts(**{**costs.as_dict(), "num_layers": 4, "sliding_layers": 2, "sliding_window": 3})
    assert windowed.effective_keys(10) == 6.5 and windowed.effective_keys(2) == 2
    # keys 1..5: full layers 15, windowed 1 + 2 + 3 + 3 + 3 = 12 -> 13.5
    assert windowed.effective_key_sum(1, 5) == 13.5 and windowed.effective_key_sum(4, 5) == 1 / 2 * 9 + 1 / 2 * 6
    assert costs.effective_key_sum(1, 5) == 15
    # batch-1 decode at 10 cached keys: reads 6.5 keys' K/V, attends to effective(11) = 7
    assert decode_token_floor(windowed, 10, read_gbps=1e-9, matmul_tflops=1e12) == 1000 + 2 * (6.5 + 1)
