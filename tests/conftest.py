"""Suite-wide setup. Runs before any test module imports kernels or the engine."""

import os

import torch

# NOTE: Triton decides at @triton.jit time whether to interpret, so this must be set
# before any kernels module is imported. On a machine without CUDA every kernel test
# runs in Triton's interpreter (small shapes); on a GPU the same tests run for real.
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

# Tests never reach the Hugging Face Hub.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
torch.set_num_threads(max(1, min(2, os.cpu_count() or 1)))
