"""The engine with tensor parallelism on CPU (gloo): rank 0 in this process, the other ranks spawned by it,
each step's forward sent to them (engine/parallel/step_mirror.py).

Continuous batches with staggered arrivals, prefix caching and preemption (a KV pool too small for every
request at once), greedy and seeded sampled requests: 2 ranks give one rank's tokens exactly. A rank that dies
ends the serving process with exit code 3 (engine/parallel/launch.py).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from engine.config import CacheConfig, EngineConfig, ModelConfig, ParallelConfig, SchedulerConfig
from engine.llm_engine import LLMEngine
from engine.parallel.launch import RANK_DIED_EXIT_CODE
from engine.sampling_params import SamplingParams
from tests.engine.engine_helpers import make_engine, mixed_sampling_params, random_prompts, run_staggered

REPO = Path(__file__).resolve().parents[2]


def serve(model_dir: Path, tensor_parallel_size: int, prompts, params, arrivals) -> tuple[dict, int]:
    """The tokens of each request, and the preemptions the run went through."""
    engine = make_engine(model_dir, num_kv_tokens=256, tensor_parallel_size=tensor_parallel_size)
    try:
        tokens = run_staggered(engine, prompts, params, arrivals)
        return tokens, engine.stats().num_preemptions
    finally:
        engine.close()


@pytest.mark.parametrize("kind", ["llama", "qwen3_moe"])
def test_two_ranks_serve_one_ranks_tokens_in_continuous_batches(kind, tiny_checkpoint):
    model_dir = tiny_checkpoint(kind)
    prompts = random_prompts(8, 49152, 5, 40, seed=3)
    prompts[5] = prompts[1][:20] + prompts[5]  # a shared prefix: cached blocks
    params = [SamplingParams(max_tokens=24, ignore_eos=True, temperature=0.0)] * 4 + mixed_sampling_params(24)[:4]
    arrivals = [0, 0, 1, 2, 4, 6, 9, 12]
    one, one_preempted = serve(model_dir, 1, prompts, params, arrivals)
    two, two_preempted = serve(model_dir, 2, prompts, params, arrivals)
    assert one_preempted > 0, "the pool must be small enough to preempt"
    assert two == one
    assert two_preempted == one_preempted


def test_a_rank_that_dies_ends_the_serving_process(tiny_checkpoint, tmp_path):
    script = textwrap.dedent(f"""
        import os, sys, time
        sys.path.insert(0, {str(REPO)!r})
        from tests.engine.engine_helpers import make_engine
        from engine.sampling_params import SamplingParams
        engine = make_engine({str(tiny_checkpoint("llama"))!r}, tensor_parallel_size=2)
        print("pid", engine.rank_group.processes[0].pid, flush=True)
        for n in range(1000000):
            if not engine.has_unfinished_requests():
                engine.add_request(f"r{{n}}", [5, 6, 7], SamplingParams(max_tokens=500, ignore_eos=True))
            engine.step()
    """)
    proc = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        line = proc.stdout.readline()
        assert line.startswith("pid "), (line, proc.stderr.read() if proc.poll() is not None else "")
        time.sleep(1.0)  # serving steps
        os.kill(int(line.split()[1]), signal.SIGKILL)
        assert proc.wait(timeout=30) == RANK_DIED_EXIT_CODE
        assert "tensor parallel rank 1 exited" in proc.stderr.read()
    finally:
        if proc.poll() is None:
            proc.kill()


@pytest.mark.parametrize(
    "model,size",
    [("smollm2", 3), ("gemma3_270m", 2)],
    ids=["smollm2-3-ranks", "gemma3-270m-2-ranks"],
)
def test_ranks_answer_a_chat_as_one_rank_does_with_the_packaged_models(model, size, request):
    """Real weights: SmolLM2-135M's 9 query and 3 KV heads over 3 ranks; Gemma 3 270M's 4 query heads and one KV
    head (replicated) over 2, its sliding layers and soft-capped logits (tied embeddings stay whole)."""
    model_dir = request.getfixturevalue(f"{model}_dir")
    texts = []
    for size_now in (1, size):
        engine = make_engine(model_dir, tensor_parallel_size=size_now)
        try:
            prompt = engine.apply_chat_template([{"role": "user", "content": "Name three colours of the rainbow."}])
            engine.add_request("chat", prompt, SamplingParams(max_tokens=24, temperature=0.0))
            tokens = []
            while engine.has_unfinished_requests():
                for out in engine.step():
                    tokens.extend(out.new_token_ids)
            texts.append(engine.tokenizer.decode(tokens))
        finally:
            engine.close()
    assert len(texts[0]) > 20
    assert texts[1] == texts[0]


def test_two_ranks_replay_rank_zeros_padded_buckets_with_the_triton_kernels(tiny_checkpoint):
    """enforce_eager with the Triton kernels (the CPU interpreter): decode and small mixed steps run as their
    graph buckets would, over the static buffers each rank fills from rank 0's broadcast."""
    model_dir = tiny_checkpoint("llama")
    prompts = random_prompts(3, 49152, 4, 12, seed=5)
    params = SamplingParams(max_tokens=6, ignore_eos=True, temperature=0.0)
    outputs, replays = [], []
    for size in (1, 2):
        config = EngineConfig(
            model=ModelConfig(model=str(model_dir), dtype="float32"),
            cache=CacheConfig(block_size=16, num_kv_tokens=1024),
            scheduler=SchedulerConfig(max_num_seqs=4, max_num_batched_tokens=64),
            device="cpu", kernels="triton", enforce_eager=True,
            parallel=ParallelConfig(tensor_parallel_size=size),
        )  # fmt: skip
        engine = LLMEngine(config)
        try:
            outputs.append(run_staggered(engine, prompts, params, [0, 1, 3]))
            replays.append((engine.runner.graphs.num_replays, engine.runner.graphs.num_mixed_replays))
        finally:
            engine.close()
    assert outputs[1] == outputs[0]
    assert replays[1] == replays[0] and replays[1][0] > replays[1][1] > 0  # decode and mixed buckets both ran


@pytest.mark.parametrize(
    "kind,size,message",
    [
        ("olmoe", 2, "does not support architecture 'OlmoeForCausalLM'"),
        ("llama", 3, r"num_attention_heads \(4\) must be divisible by tensor_parallel_size \(3\)"),
    ],
)
def test_an_engine_refuses_what_its_ranks_cannot_hold_before_starting_them(kind, size, message, tiny_checkpoint):
    """One clear error from config.json alone, and no rank process left behind."""
    import multiprocessing

    with pytest.raises(ValueError, match=message):
        make_engine(tiny_checkpoint(kind), tensor_parallel_size=size)
    assert not multiprocessing.active_children()
