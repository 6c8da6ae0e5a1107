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
