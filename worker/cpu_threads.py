"""How many intra-op threads torch gets in a worker that runs on the CPU.

torch starts one intra-op thread per core it sees. A CPU worker that takes every core
leaves none for the processes it serves beside it (the API, Redis, the worker's event
publisher, the client): OpenMP threads spin at the end of every parallel region, so the
one core another process takes stalls every step of the worker, not a share of them.
The default therefore keeps one usable core free (docs/decisions/0045-cpu-worker-threads.md).
A GPU worker's host threads do little intra-op work; its count stays torch's.
"""

from __future__ import annotations

import logging
import os

import torch

logger = logging.getLogger(__name__)


def usable_cores() -> int:
    """Cores this process may run on (its CPU affinity, which container cpusets narrow)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def default_cpu_threads(torch_default: int, cores: int) -> int:
    """One core fewer than the usable cores, never more than torch's own choice, at least one.

    Args:
        torch_default: torch.get_num_threads() before any setting (physical cores, or OMP_NUM_THREADS).
        cores: usable_cores().
    """
    return max(1, min(torch_default, cores - 1))


def apply_cpu_threads(requested: int | None, device: torch.device) -> int | None:
    """Sets torch's intra-op thread count for a CPU worker and logs it; returns it (None on a GPU).

    Args:
        requested: the cpu_threads setting; None picks default_cpu_threads, unless
            OMP_NUM_THREADS is set, which then stands (the user chose it for this process).
        device: the worker's resolved device.
    """
    if device.type != "cpu":
        return None
    cores = usable_cores()
    if requested is not None:
        threads, source = requested, "INFERQ_CPU_THREADS"
    elif os.environ.get("OMP_NUM_THREADS"):
        threads, source = torch.get_num_threads(), "OMP_NUM_THREADS"
    else:
        threads, source = default_cpu_threads(torch.get_num_threads(), cores), "default: cores - 1"
    torch.set_num_threads(threads)
    applied = torch.get_num_threads()
    logger.info("CPU worker: %d torch intra-op thread(s) on %d usable core(s) (%s)", applied, cores, source)
    return applied
