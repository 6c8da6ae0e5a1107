"""Offline API: `LLM(model=...).generate(prompts, params)` and `.chat(messages)`."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from engine.config import CacheConfig, EngineConfig, ModelConfig, SchedulerConfig
from engine.llm_engine import LLMEngine
from engine.request import Logprob
from engine.sampling_params import SamplingParams


@dataclass
class CompletionOutput:
    """One choice of one prompt, whole."""

    index: int
    text: str = ""
    token_ids: list[int] = field(default_factory=list)
    logprobs: list[Logprob] = field(default_factory=list)
    finish_reason: str | None = None
    num_prompt_tokens: int = 0
    error: str | None = None


class LLM:
    """Runs batches of prompts to completion.

    Args:
        model: checkpoint path, `.gguf` file, Hub id, or "default" (packaged SmolLM2).
        engine_config: a full configuration (overrides the keyword shortcuts).
        cache_dir: where converted checkpoints are kept.
        **kwargs: shortcuts: dtype, max_model_len, load_format, generation_defaults, device, kernels,
            block_size, num_kv_tokens, gpu_memory_utilization, max_num_seqs,
            max_num_batched_tokens, enable_prefix_caching, enforce_eager, async_scheduling, policy, and
            speculative (a SpeculativeConfig).
    """

    def __init__(
        self, model: str = "default", engine_config: EngineConfig | None = None, cache_dir: str | None = None, **kwargs
    ) -> None:
        self.engine = LLMEngine(engine_config or _config_from_kwargs(model, kwargs), cache_dir=cache_dir)
        self.tokenizer = self.engine.tokenizer
        self._next_id = 0

    def generate(
        self,
        prompts: str | Sequence[str] | Sequence[list[int]],
        params: SamplingParams | Sequence[SamplingParams] | None = None,
    ) -> list[list[CompletionOutput]]:
        """Returns, per prompt, its n choices in order. Prompts are text or token id lists."""
        if isinstance(prompts, str) or (prompts and isinstance(prompts[0], int)):
            prompts = [prompts]  # type: ignore[list-item]
        token_lists = [p if isinstance(p, list) else self.engine.encode(p) for p in prompts]
        return self._run(token_lists, params)

    def chat(
        self,
        messages: list[dict] | list[list[dict]],
        params: SamplingParams | Sequence[SamplingParams] | None = None,
    ) -> list[list[CompletionOutput]]:
        """One conversation (a list of {role, content}) or several; applies the chat template."""
        conversations = [messages] if messages and isinstance(messages[0], dict) else messages
        token_lists = [self.engine.apply_chat_template(c) for c in conversations]  # type: ignore[arg-type]
        return self._run(token_lists, params)

    def _run(
        self, token_lists: list[list[int]], params: SamplingParams | Sequence[SamplingParams] | None
    ) -> list[list[CompletionOutput]]:
        if params is None:  # the model's own sampling defaults, as vLLM's LLM takes them
            params = self.engine.sampling_params({})
        if isinstance(params, SamplingParams):
            params = [params] * len(token_lists)
        if len(params) != len(token_lists):
            raise ValueError(f"got {len(params)} SamplingParams for {len(token_lists)} prompts")
        ids = []
        results: dict[str, list[CompletionOutput]] = {}
        for tokens, p in zip(token_lists, params, strict=True):
            request_id = f"offline-{self._next_id}"
            self._next_id += 1
            self.engine.add_request(request_id, tokens, p)
            ids.append(request_id)
            results[request_id] = [CompletionOutput(i, num_prompt_tokens=len(tokens)) for i in range(p.n)]
        while self.engine.has_unfinished_requests():
            for out in self.engine.step():
                choice = results[out.request_id][out.index]
                choice.text += out.new_text
                choice.token_ids.extend(out.new_token_ids)
                if out.new_logprobs:
                    choice.logprobs.extend(out.new_logprobs)
                if out.finished:
                    choice.finish_reason = out.finish_reason
                    choice.error = out.error
        return [results[i] for i in ids]


def _config_from_kwargs(model: str, kw: dict) -> EngineConfig:
    def take(names: tuple[str, ...]) -> dict:
        return {k: kw.pop(k) for k in names if k in kw}

    config = EngineConfig(
        model=ModelConfig(
            model=model,
            **take(
                ("dtype", "max_model_len", "load_format", "seed", "revision", "generation_defaults", "quantization")
            ),
        ),
        cache=CacheConfig(**take(("block_size", "num_kv_tokens", "gpu_memory_utilization", "enable_prefix_caching"))),
        scheduler=SchedulerConfig(**take(("max_num_seqs", "max_num_batched_tokens", "policy"))),
        **take(("device", "kernels", "enforce_eager", "async_scheduling", "speculative")),
    )
    if kw:
        raise TypeError(f"unknown LLM arguments: {sorted(kw)}")
    return config
