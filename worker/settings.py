"""Every worker setting, from command-line flags or INFERQ_* environment variables.

Flags win over the environment, which wins over the defaults:
`python -m worker --model ./ckpt --redis-url redis://redis:6379/0` equals
`INFERQ_MODEL=./ckpt INFERQ_REDIS_URL=redis://redis:6379/0 python -m worker`.
"""

from __future__ import annotations

from typing import Literal, get_args

from pydantic import Field, model_validator
from pydantic_settings import BaseSettings, CliApp, SettingsConfigDict

from worker.protocol import DEFAULT_HEARTBEAT_INTERVAL_S, DEFAULT_HEARTBEAT_TTL_S, DEFAULT_PREFIX, DEFAULT_RESULT_TTL_S

# the on-the-fly schemes of engine/quantization/scheme.py (engine.config.QUANTIZATIONS; a test keeps them equal):
# named here so that `inferq up --quantization` offers them without importing the engine
Quantization = Literal["fp8", "int8", "int4", "nf4"]
QUANTIZATIONS: tuple[str, ...] = get_args(Quantization)


class WorkerSettings(BaseSettings):
    model_config = SettingsConfigDict(
        env_prefix="INFERQ_",
        cli_kebab_case=True,
        cli_implicit_flags=True,
        cli_prog_name="python -m worker",
        extra="ignore",
        frozen=True,
    )

    # ---- Redis -------------------------------------------------------------------------
    redis_url: str = Field("redis://localhost:6379/0", description="Redis URL (redis:// or rediss://).")
    prefix: str = Field(DEFAULT_PREFIX, description="Prefix of every Redis key and stream name.")
    consumer: str | None = Field(
        None,
        description="Consumer name in the group; default hostname-pid-random. Set a stable name (a pod name) "
        "so a restarted worker picks up its own pending messages first.",
    )

    # ---- model and engine ----------------------------------------------------------------
    model: str = Field("default", description="Checkpoint: local dir, .gguf file, Hub id, or 'default'.")
    served_model_name: str | None = Field(None, description="Model name reported to clients; default: --model.")
    dtype: Literal["auto", "float32", "float16", "bfloat16"] = Field("auto", description="Weights/activations dtype.")
    device: str = Field("auto", description="'auto', 'cpu', 'cuda' or 'cuda:N'.")
    kernels: Literal["auto", "torch", "triton"] = Field("auto", description="Triton kernels or torch references.")
    quantization: Quantization | None = Field(
        None,
        description="Quantize a dense checkpoint's linear layers at load: int8/fp8 per channel, int4 in groups of "
        "128 (64 or 32 where 128 does not divide a layer), nf4 in blocks of 64 (docs/quantization.md); quantized "
        "checkpoints load as they are without it.",
    )
    enforce_eager: bool = Field(
        False, description="Disable CUDA graphs (small steps still pad to the graph buckets, each run once at start)."
    )
    pdl: bool | None = Field(
        None,
        description="Programmatic dependent launch of the decode kernels on sm_90+ GPUs; default: on.",
    )
    async_scheduling: bool | None = Field(
        None,
        description="Launch step k+1 before reading step k's tokens (host work overlaps the GPU); "
        "default: on for CUDA, off for CPU.",
    )
    cpu_threads: int | None = Field(
        None,
        ge=1,
        description="torch intra-op threads of a CPU worker; default: usable cores - 1 (the API, Redis and "
        "clients keep a core), or OMP_NUM_THREADS when set. A GPU worker ignores it.",
    )
    max_model_len: int | None = Field(None, ge=1, description="Longest prompt + output; default: the checkpoint's.")
    generation_defaults: Literal["model", "none"] = Field(
        "model",
        description="'model': sampling fields a request leaves out (temperature, top_p, top_k, min_p, "
        "repetition_penalty, max_tokens) take the checkpoint's generation_config.json values, as vLLM's "
        "--generation-config auto; 'none': SamplingParams' defaults.",
    )
    block_size: int = Field(64, ge=1, description="Tokens per KV block.")
    num_kv_tokens: int | None = Field(None, ge=1, description="KV pool size in tokens (overrides memory sizing).")
    gpu_memory_utilization: float = Field(0.9, gt=0, le=1, description="Fraction of GPU memory the worker may use.")
    enable_prefix_caching: bool = Field(True, description="Reuse KV blocks of shared prompt prefixes.")
    max_num_seqs: int = Field(256, ge=1, description="Most requests running at once.")
    max_num_batched_tokens: int = Field(8192, ge=1, description="Token budget of one engine step.")
    grammar_compile_timeout_s: float = Field(
        10.0, gt=0, description="Longest a structured output request waits for its grammar to compile."
    )
    scheduling_policy: Literal["fcfs", "priority"] = Field(
        "priority", description="'priority': lower `priority` first, then arrival order."
    )
    max_queued_seqs: int = Field(
        0,
        ge=0,
        description="Under the 'priority' policy, requests a worker reads beyond its free sequence slots: they wait "
        "in its engine, which orders them by priority, instead of in the request stream, where a request waits "
        "behind every earlier one whatever its priority (a Batch API batch's lines ahead of interactive "
        "requests). Off by default: a worker that reads ahead takes requests other workers could start now "
        "(decision 0062). 0 reads only what can start; 'fcfs' always does.",
    )
    max_background_seqs: int = Field(
        32,
        ge=0,
        description="Under the 'priority' policy, the most requests of priority above 0 (a Batch API batch's lines) "
        "started beside requests of priority 0 or below: a full-width batch makes every step, and so interactive "
        "TTFT and ITL, several times longer. A batch alone uses every slot; max_num_seqs lifts the limit "
        "(decision 0066).",
    )
    speculative_method: Literal["ngram", "draft"] | None = Field(
        None,
        description="Speculative decoding: 'ngram' proposes the tokens that followed the newest n-gram's latest "
        "earlier occurrence (prompt lookup), 'draft' those of --draft-model; the model verifies them in one "
        "forward and keeps its own tokens, so outputs are unchanged. Default: off.",
    )
    draft_model: str | None = Field(
        None, description="The draft checkpoint of --speculative-method draft: a smaller model with the same tokenizer."
    )
    draft_num_kv_tokens: int | None = Field(
        None, ge=1, description="The draft's KV pool in tokens; default: --num-kv-tokens, or 8192."
    )
    num_speculative_tokens: int = Field(4, ge=1, le=16, description="Most tokens proposed per request and step.")
    speculative_max_batch_size: int = Field(
        16, ge=1, description="No speculation in a step with more running requests than this."
    )
    speculative_min_acceptance_rate: float = Field(
        0.2,
        ge=0,
        le=1,
        description="No speculation while the recent fraction of proposed tokens kept is below this (one step "
        "in 16 still speculates, so the rate can recover).",
    )

    tensor_parallel_size: int = Field(
        1,
        ge=1,
        le=16,
        description="Split the model over this many GPUs of the host, one process each, rank r on cuda:r "
        "(docs/tensor-parallelism.md); 1 runs it whole.",
    )

    # ---- intake and leases --------------------------------------------------------------------
    batch_window_ms: float = Field(
        5.0, ge=0, description="Wait this long after an arrival to gather more so their prefills run together."
    )
    batch_window_gap_ms: float | None = Field(
        None,
        ge=0,
        description="Close the window early once nothing new arrived for this long (default: a quarter of the window).",
    )
    idle_block_ms: int = Field(500, ge=1, description="Longest blocking read when idle (how fast a stop is seen).")
    lease_ms: int = Field(
        30_000,
        ge=50,
        description="A held message is renewed every lease_ms/3; others may claim it once idle longer than lease_ms.",
    )
    claim_interval_ms: int = Field(5_000, ge=10, description="How often to look for dead workers' messages.")
    max_deliveries: int = Field(5, ge=1, description="A message delivered more often is poison: dead-lettered.")
    trim_requests: bool = Field(
        True, description="Trim acknowledged messages from the request stream (XTRIM MINID) every 30 s."
    )
    result_ttl_s: int = Field(DEFAULT_RESULT_TTL_S, ge=1, description="Result streams expire this long after a write.")
    publisher_process: bool = Field(
        True,
        description="Write events to Redis from a child process (else a thread, which shares the engine loop's GIL).",
    )

    # ---- liveness and shutdown ---------------------------------------------------------------------
    heartbeat_interval_s: float = Field(DEFAULT_HEARTBEAT_INTERVAL_S, gt=0, description="Heartbeat period.")
    heartbeat_ttl_s: int = Field(DEFAULT_HEARTBEAT_TTL_S, ge=1, description="TTL of the heartbeat key.")
    shutdown_grace_s: float = Field(
        30.0, ge=0, description="On SIGTERM, finish running requests for this long, then hand the rest off."
    )
    metrics_port: int = Field(9400, ge=0, le=65535, description="Prometheus /metrics port; 0 disables.")
    log_level: str = Field("INFO", description="Python logging level.")

    @model_validator(mode="after")
    def _check(self) -> WorkerSettings:
        if self.block_size & (self.block_size - 1):
            raise ValueError(f"block_size must be a power of two, got {self.block_size}")
        if self.heartbeat_ttl_s <= self.heartbeat_interval_s:
            raise ValueError(
                f"heartbeat_ttl_s ({self.heartbeat_ttl_s}) must exceed heartbeat_interval_s "
                f"({self.heartbeat_interval_s})"
            )
        return self

    @classmethod
    def from_cli(cls, argv: list[str] | None = None) -> WorkerSettings:
        """Flags (argv, default sys.argv[1:]) over INFERQ_* environment variables over defaults."""
        return CliApp.run(cls, cli_args=argv)

    @property
    def model_name(self) -> str:
        return self.served_model_name or self.model

    def engine_config(self):
        """The engine's frozen EngineConfig built from these settings."""
        from engine.config import (
            CacheConfig,
            EngineConfig,
            ModelConfig,
            ParallelConfig,
            SchedulerConfig,
            SpeculativeConfig,
        )

        return EngineConfig(
            model=ModelConfig(
                model=self.model,
                dtype=self.dtype,
                max_model_len=self.max_model_len,
                generation_defaults=self.generation_defaults,
                quantization=self.quantization,
            ),
            cache=CacheConfig(
                block_size=self.block_size,
                gpu_memory_utilization=self.gpu_memory_utilization,
                num_kv_tokens=self.num_kv_tokens,
                enable_prefix_caching=self.enable_prefix_caching,
            ),
            scheduler=SchedulerConfig(
                max_num_seqs=self.max_num_seqs,
                max_num_batched_tokens=self.max_num_batched_tokens,
                policy=self.scheduling_policy,
                max_background_seqs=self.max_background_seqs,
            ),
            device=self.device,
            kernels=self.kernels,
            enforce_eager=self.enforce_eager,
            pdl=self.pdl,
            async_scheduling=self.async_scheduling,
            speculative=SpeculativeConfig(
                method=self.speculative_method,
                num_speculative_tokens=self.num_speculative_tokens,
                draft_model=self.draft_model,
                draft_num_kv_tokens=self.draft_num_kv_tokens,
                max_batch_size=self.speculative_max_batch_size,
                min_acceptance_rate=self.speculative_min_acceptance_rate,
            ),
            parallel=ParallelConfig(tensor_parallel_size=self.tensor_parallel_size),
        )
