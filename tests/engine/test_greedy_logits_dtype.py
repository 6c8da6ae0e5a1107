"""Plain greedy steps sample from the LM head's output in the model's dtype (LMHead, widen=False: no
cast to float32, whose values would only widen it), and choose exactly the tokens that greedy over
float32 logits chooses (the Sampler's path, taken here by asking for logprobs). A bf16 model on the CPU,
torch references: the dtype and the argmax contract are the engine's, not a kernel's."""

from __future__ import annotations

import torch

from engine import ops
from engine.config import CacheConfig, EngineConfig, ModelConfig, SchedulerConfig
from engine.llm_engine import LLMEngine
from engine.sampling_params import SamplingParams
from tests.engine.engine_helpers import random_prompts, run_staggered


def test_plain_greedy_samples_model_dtype_logits_and_chooses_the_float32_tokens(tiny_llama_dir, monkeypatch):
    engine = LLMEngine(
        EngineConfig(
            model=ModelConfig(model=str(tiny_llama_dir), dtype="bfloat16"),
            cache=CacheConfig(num_kv_tokens=4096),
            scheduler=SchedulerConfig(max_num_seqs=8, max_num_batched_tokens=256),
            device="cpu",
        )
    )
    seen_dtypes = []
    greedy = ops.greedy_sample
    monkeypatch.setattr(ops, "greedy_sample",
                        lambda logits: seen_dtypes.append(logits.dtype) or greedy(logits))  # fmt: skip
    prompts = random_prompts(3, 49152, 4, 24, seed=5)
    arrivals = [0, 2, 4]  # prefills beside decodes: steps of one and of several sampled rows
    plain = run_staggered(engine, prompts, SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True), arrivals)
    assert seen_dtypes and set(seen_dtypes) == {torch.bfloat16}
    seen_dtypes.clear()
    widened = SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True, logprobs=0)  # the Sampler, float32
    assert run_staggered(engine, prompts, widened, arrivals) == plain
    assert not seen_dtypes
