"""What a tensor-parallel rank other than 0 runs: join the group, build its shard of the model and the same
ModelRunner as rank 0, then run each step's forward as rank 0 sends it (engine/parallel/step_mirror.py)
until rank 0 closes.

A rank whose parent (rank 0's process) is gone exits at once: on NCCL it would otherwise wait in its next
collective for ever.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from datetime import timedelta

import torch
import torch.distributed as dist

from engine import ops
from engine.config import EngineConfig
from engine.engine_setup import build_model_runner, resolve_device, resolve_dtype
from engine.model_loader import load_model
from engine.parallel.group import TensorParallel
from kernels._pdl import set_pdl
from kernels.interpreter import use_cpu_interpreter

logger = logging.getLogger(__name__)

PARENT_CHECK_S = 0.5


def follower_main(
    config: EngineConfig, rank: int, init_method: str, backend: str, cache_dir: str | None, parent_pid: int
) -> None:
    """The process of rank `rank` (spawned by engine/parallel/launch.py)."""
    logging.basicConfig(level=logging.INFO, format=f"%(asctime)s tp-rank{rank} %(levelname)s %(name)s: %(message)s")
    threading.Thread(target=_exit_with_parent, args=(parent_pid,), name="inferq-tp-parent", daemon=True).start()
    size = config.parallel.tensor_parallel_size
    device = resolve_device(config.device)
    if device.type == "cuda":
        device = torch.device("cuda", rank)
        torch.cuda.set_device(device)
    else:
        torch.set_num_threads(max(1, (os.cpu_count() or 1) // size))
        if os.environ.get("TRITON_INTERPRET") == "1":  # rank 0 runs the kernels on the interpreter: so does this
            use_cpu_interpreter()
    dtype = resolve_dtype(config.model.dtype, device)
    ops.set_kernel_backend(config.kernels)
    if config.pdl is not None:
        set_pdl(config.pdl)
    dist.init_process_group(
        backend, init_method=init_method, rank=rank, world_size=size,
        timeout=timedelta(seconds=config.parallel.init_timeout_s),
    )  # fmt: skip
    tp = TensorParallel(rank, size, dist.group.WORLD)
    loaded = load_model(config.model, device, dtype, cache_dir=cache_dir, tp=tp)
    runner = build_model_runner(config, loaded.model, device, dtype, loaded.max_model_len, tp)
    logger.info("rank %d of %d (pid %d) ready on %s: following rank 0's steps", rank, size, os.getpid(), device)
    follow_steps(runner)
    dist.destroy_process_group()


@torch.inference_mode()
def follow_steps(runner) -> None:  # noqa: ANN001 (engine.model_runner.ModelRunner: imported by its users)
    """Runs each step's forward as rank 0 sends it, until rank 0 closes."""
    mirror = runner.mirror
    assert mirror is not None and runner.tp.rank != 0
    while True:
        header = mirror.receive()
        if header.op == "stop":
            return
        if header.bucket is not None:
            runner.graphs.run((header.bucket[0], header.bucket[1]), greedy=header.greedy)
            continue
        input_ids, positions, meta = runner.inputs.step_views(
            header.num_tokens, header.num_padded, header.max_query_len, header.max_seq_len,
            header.seq_lens_cpu or [], header.query_lens_cpu or [],
        )  # fmt: skip
        runner.forward(input_ids, positions, meta)


def _exit_with_parent(parent_pid: int) -> None:
    while True:
        if os.getppid() != parent_pid:
            os._exit(0)
        time.sleep(PARENT_CHECK_S)
