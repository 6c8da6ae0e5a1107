"""Rank 0 starting the other ranks of a tensor-parallel group, watching them, and closing them.

Each other rank is a process of its own (spawned: CUDA cannot be forked), on cuda:r, which joins the group
through a rendezvous file and builds the same engine pieces (engine/parallel/follower.py). A rank that dies
leaves the group unable to run another step, and on NCCL rank 0 would wait in its next collective for ever;
so from their start a thread watches the ranks and ends this process (exit code 3) as soon as one exits: the
worker goes down as in a crash, and another worker resumes its requests (docs/architecture.md, "When things
fail").
"""

from __future__ import annotations

import logging
import os
import shutil
import tempfile
import threading
from datetime import timedelta

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from engine.config import EngineConfig
from engine.parallel.follower import follower_main
from engine.parallel.group import RANK_WATCH_INTERVAL_S, TensorParallel

logger = logging.getLogger(__name__)

RANK_DIED_EXIT_CODE = 3


def backend_for(config: EngineConfig, device: torch.device) -> str:
    """torch.distributed's backend: the configured one, or NCCL on CUDA and gloo on CPU."""
    if config.parallel.backend != "auto":
        return config.parallel.backend
    return "nccl" if device.type == "cuda" else "gloo"


class RankGroup:
    """Rank 0's handle on the group: its TensorParallel, the other ranks' processes, and their watch.

    Args:
        config: the engine's configuration (every rank builds from it).
        device: rank 0's device (cuda:0, or CPU).
        cache_dir: where converted checkpoints are kept (as LLMEngine's).

    Raises:
        ValueError: fewer GPUs than ranks, or rank 0 not on cuda:0.
    """

    def __init__(self, config: EngineConfig, device: torch.device, cache_dir: str | None) -> None:
        size = config.parallel.tensor_parallel_size
        if device.type == "cuda":
            if (device.index or 0) != 0:
                raise ValueError(f"tensor parallelism puts rank r on cuda:r: rank 0 must be cuda:0, got {device}")
            if torch.cuda.device_count() < size:
                raise ValueError(
                    f"tensor_parallel_size {size} needs {size} GPUs, this process sees {torch.cuda.device_count()} "
                    "(CUDA_VISIBLE_DEVICES)"
                )
        backend = backend_for(config, device)
        timeout = timedelta(seconds=config.parallel.init_timeout_s)
        self._rendezvous_dir = tempfile.mkdtemp(prefix="inferq-tp-")
        init_method = f"file://{self._rendezvous_dir}/rendezvous"
        context = mp.get_context("spawn")
        self.processes = [
            context.Process(
                target=follower_main,
                name=f"inferq-tp-rank{rank}",
                daemon=True,
                args=(config, rank, init_method, backend, cache_dir, os.getpid()),
            )  # fmt: skip
            for rank in range(1, size)
        ]
        for process in self.processes:
            process.start()
        logger.info("tensor parallel: started ranks 1..%d (%s); joining the group", size - 1, backend)
        # a rank that exits ends this process from now on, a start that fails on another rank (out of memory)
        # included: rank 0 would otherwise wait for it in a collective until the timeout
        self._closing = threading.Event()
        self._watch = threading.Thread(target=self._watch_ranks, name="inferq-tp-watch", daemon=True)
        self._watch.start()
        dist.init_process_group(backend, init_method=init_method, rank=0, world_size=size, timeout=timeout)
        self.tp = TensorParallel(0, size, dist.group.WORLD)

    def _watch_ranks(self) -> None:
        while not self._closing.wait(RANK_WATCH_INTERVAL_S):
            for rank, process in enumerate(self.processes, start=1):
                if process.exitcode is not None and not self._closing.is_set():
                    logger.critical(
                        "tensor parallel rank %d exited (code %s): the group cannot run another step; "
                        "exiting so that another worker resumes the requests", rank, process.exitcode,
                    )  # fmt: skip
                    logging.shutdown()
                    os._exit(RANK_DIED_EXIT_CODE)

    def close(self, timeout_s: float = 30.0) -> None:
        """After rank 0's runner sent its stop (or failed to build): waits for the ranks, ends the stragglers,
        leaves the group."""
        self._closing.set()
        for process in self.processes:
            process.join(timeout_s)
            if process.is_alive():
                process.terminate()
                process.join(5.0)
        if dist.is_initialized():
            dist.destroy_process_group()
        shutil.rmtree(self._rendezvous_dir, ignore_errors=True)
