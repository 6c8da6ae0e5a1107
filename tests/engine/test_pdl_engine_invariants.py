"""The engine's side of the PDL contract (kernels/_pdl.py): what the kernels may read before their
griddepcontrol.wait is only safe because the engine keeps three promises, checked here on the CPU
through the Triton kernels (interpreter) where they have a CPU form:

1. The step's metadata (input ids, positions, slots, sequence lengths, block tables) is staged into
   the InputBatch's device buffers before the forward, and nothing in the forward writes them. The
   decode kernel's order of the sequences (longest first) is sorted from them by a torch op before the
   forward (engine.attention_ops.decode_order), and the forward leaves it alone too.
2. The forward's first operation is the embedding, a torch op (on CUDA a kernel launched without
   PDL): no PDL kernel of the step can start before the staged metadata is complete.
3. A step writes K/V only into blocks that its own sequence holds alone. Decode attention loads the
   keys and values before each sequence's newest position before its wait, so no kernel of the same
   step may write a block another sequence reads (prefix caching shares only full, immutable blocks).

If a change breaks one of these (say, an embedding fused into a PDL kernel, or metadata built on
the device inside the forward), the early reads become races that no output test on the CPU sees.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from engine.sampling_params import SamplingParams
from tests.engine.engine_helpers import make_engine, random_prompts, run_staggered
from tests.engine.gpu_checkpoints import tiny_checkpoint_factory

# 7 requests over time; the last four repeat the first one's prompt (whole blocks of it cached), one of
# them exactly 4 blocks of 8 tokens: a prompt cached to its end, whose last block is computed again.
ARRIVALS = [0, 0, 1, 3, 5, 8, 10]


@pytest.fixture(scope="module")
def tiny_ckpt(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Callable[[str], Path]:
    return tiny_checkpoint_factory(request, tmp_path_factory)


def _prompts() -> list[list[int]]:
    first, second, third = random_prompts(3, 49152, 34, 40, seed=5)
    return [first, second, third, first + [321], first, first[:33], first[:32]]


class _FirstOps(TorchDispatchMode):
    """Records the first torch ops dispatched inside it, in order."""

    def __init__(self, events: list[str]) -> None:
        super().__init__()
        self.events = events

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.events.append(f"torch:{func.overloadpacket.__name__}")
        return func(*args, **(kwargs or {}))


def _record_triton_launches(monkeypatch: pytest.MonkeyPatch, events: list[str]) -> None:
    """Every kernel launcher checks its devices first (kernels._launch.check_device): record each call
    as the launch of its kernel, in the same list as the torch ops."""
    from kernels import _launch

    original = _launch.check_device

    def recording(kernel, names, *tensors):
        events.append(f"triton:{getattr(kernel, '__name__', kernel)}")
        return original(kernel, names, *tensors)

    for name, module in list(sys.modules.items()):
        if name.startswith("kernels.") and getattr(module, "check_device", None) is original:
            monkeypatch.setattr(module, "check_device", recording)


@pytest.mark.skipif(torch.cuda.is_available(), reason="the Triton kernels on the CPU need the interpreter (no GPU)")
@pytest.mark.parametrize("kind", ["llama", "gpt2"])
def test_the_forward_starts_with_the_embedding_and_leaves_the_staged_metadata_alone(
    kind: str, tiny_ckpt: Callable[[str], Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    engine = make_engine(tiny_ckpt(kind), kernels="triton", enable_prefix_caching=True)
    model, inputs = engine.runner.model, engine.runner.inputs
    staged = {"int64": inputs._dev64, "int32": inputs._dev32, "block tables": inputs.block_tables}
    forwards: list[list[str]] = []
    original_forward = model.forward
    events: list[str] = []
    _record_triton_launches(monkeypatch, events)

    orders_seen = []

    def watched_forward(*args, **kwargs):
        before = {name: t.clone() for name, t in staged.items()}
        meta = args[3]
        if meta.decode_order is not None:  # complete before the forward: longest context first
            lens = meta.seq_lens[meta.decode_order].tolist()
            assert sorted(meta.decode_order.tolist()) == list(range(meta.num_seqs)) and lens == sorted(lens)[::-1]
            before["decode order"] = meta.decode_order.clone()
            orders_seen.append(meta.num_seqs)
        events.clear()
        with _FirstOps(events):
            hidden = original_forward(*args, **kwargs)
        for name, t in staged.items():
            assert torch.equal(t, before[name]), f"the forward wrote the staged step metadata ({name} buffer)"
        if meta.decode_order is not None:
            assert torch.equal(meta.decode_order, before["decode order"]), "the forward wrote the decode order"
        forwards.append(list(events))
        return hidden

    monkeypatch.setattr(model, "forward", watched_forward)
    params = SamplingParams(temperature=0.0, max_tokens=4, ignore_eos=True)
    run_staggered(engine, _prompts()[:3], params, [0, 0, 1])
    assert len(forwards) >= 4  # prefill, mixed and decode steps
    assert orders_seen and max(orders_seen) >= 2  # decode steps of several sequences took the sorted grid
    for ops in forwards:
        assert any(op.startswith("triton:") for op in ops), ops[:10]  # the kernels really ran
        assert ops[0] == "torch:embedding", ops[:5]


def test_steps_write_kv_only_into_blocks_their_sequence_holds_alone(tiny_ckpt: Callable[[str], Path]) -> None:
    engine = make_engine(tiny_ckpt("llama"), block_size=8, enable_prefix_caching=True)
    blocks = engine.scheduler.block_manager.blocks
    original_prepare = engine.runner.inputs.prepare
    checked = {"slots": 0, "shared_blocks_seen": 0}

    def watched_prepare(items, *args, **kwargs):
        step = original_prepare(items, *args, **kwargs)
        held_by = {}
        for item in items:
            for block_id in item.block_ids:
                held_by.setdefault(block_id, set()).add(item.request.request_id)
        checked["shared_blocks_seen"] += sum(1 for owners in held_by.values() if len(owners) > 1)
        for slot in step.meta.slot_mapping.tolist():
            if slot < 0:
                continue
            block_id = slot // engine.runner.block_size
            assert blocks[block_id].ref_count == 1, f"slot {slot} is in block {block_id}, held {blocks[block_id]}"
            assert len(held_by[block_id]) == 1, f"block {block_id} written while {held_by[block_id]} read it"
            checked["slots"] += 1
        return step

    engine.runner.inputs.prepare = watched_prepare
    params = SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True)
    run_staggered(engine, _prompts(), params, ARRIVALS)
    assert checked["slots"] > 100
    assert checked["shared_blocks_seen"] > 0  # the repeated prompts did share cached blocks in a step
    assert engine.scheduler.block_manager.num_prefix_hits > 0
