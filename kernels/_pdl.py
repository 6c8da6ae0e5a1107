"""Programmatic dependent launch (PDL, Hopper and newer): the next kernel starts before this one ends.

Without it, a kernel's programs start only after every program of the kernel before it has
finished and its writes are flushed: each boundary costs the launch, the first loads' DRAM
latency and the previous kernel's tail, in which a few programs finish on an otherwise idle GPU.
At batch-1 decode a step is ~100-200 such boundaries between short weight-streaming kernels.
Every Triton kernel here takes part except prefill attention (long, compute-bound programs).

With PDL a kernel launched with `launch_pdl=True` may start once every program of the kernel
before it has called `griddepcontrol.launch_dependents` (or exited). Its programs must then call
`griddepcontrol.wait` before they touch anything an earlier kernel writes or reads: the wait
returns once the previous kernel has completed and its memory is visible. Because every kernel
launched this way waits before it can finish, "the previous kernel completed" means every
earlier kernel on the stream completed too.

The contract of every kernel here that takes a PDL flag:
- `pdl_launch_dependents(PDL)` first, so that the next kernel's programs can be scheduled while
  this one's last programs run;
- before `pdl_wait(PDL)` only loads of what no kernel of the step writes, so that they stream while
  the kernels before finish:
  - model weights and tables (the rotary cos/sin), never written during inference: a projection's
    first weight tiles;
  - the step's metadata (positions, slots, sequence lengths, block tables, the decode kernel's order of
    the sequences). The host stages it into device buffers by copies and torch ops (the order: a torch
    sort) before the forward, whose first kernel (the embedding) is a torch op launched without PDL, so
    all of it is complete before any PDL kernel of the step starts;
  - in decode attention, the keys and values of the positions before each sequence's newest: stored by
    earlier steps (a decode step writes one slot a sequence, its newest; no other sequence writes into
    a block another reads, since only full blocks are shared);
- after it everything else: activations, the newest K/V, and every store.
Kernels launched without the flag (cuBLAS, torch ops) keep full stream order on both sides.
The engine's side of this (metadata staged before the forward and never written in it, the embedding
first, K/V written only into blocks the writing sequence holds alone) is checked on the CPU by
tests/engine/test_pdl_engine_invariants.py; the kernels' side by tests/kernels/test_pdl_contract.py.

CUDA graphs keep the dependency (stream capture records programmatic edges, CUDA >= 12.3).
The CPU interpreter has no griddepcontrol (inline PTX), so PDL is off there, and the
instructions are no-ops when a kernel is launched without the attribute.

INFERQ_PDL=0 turns it off for the process (A/B runs, or a driver that misbehaves); `set_pdl`
overrides the environment (the engine does, from EngineConfig.pdl, the worker's `pdl` setting;
benchmarks and tests too).
"""

from __future__ import annotations

import functools
import os

import torch
import triton
import triton.language as tl
from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait

from kernels._launch import interpreting

PDL_ENV = "INFERQ_PDL"
MIN_CAPABILITY = (9, 0)  # griddepcontrol is sm_90+

_forced: bool | None = None  # set_pdl's override; None: the environment decides


def set_pdl(enabled: bool | None) -> None:
    """Force PDL on or off for this process (None: back to INFERQ_PDL, default on)."""
    global _forced
    _forced = enabled


def parse_pdl_setting(value: str) -> bool:
    """INFERQ_PDL's value -> on or off; anything else is an error that names the variable."""
    value = value.strip().lower()
    if value in ("1", "true", "on", "yes"):
        return True
    if value in ("0", "false", "off", "no"):
        return False
    raise ValueError(f"{PDL_ENV} must be 0 or 1, got {value!r}")


@functools.lru_cache(maxsize=1)
def _env_setting() -> bool:
    return parse_pdl_setting(os.environ.get(PDL_ENV, "1"))  # read once: launchers ask on every launch


def pdl_requested() -> bool:
    """What this process asks for: set_pdl's override, else INFERQ_PDL (default on)."""
    return _forced if _forced is not None else _env_setting()


@functools.lru_cache(maxsize=8)
def _capable(index: int) -> bool:
    # NOTE: cached with the interpreter check: launchers ask on every launch, and neither changes in a process
    return not interpreting() and torch.cuda.get_device_capability(index) >= MIN_CAPABILITY


def use_pdl(device: torch.device) -> bool:
    """Whether kernels on `device` launch with PDL: a CUDA GPU of sm_90 or newer, compiled kernels
    (not the interpreter), and not turned off."""
    if device.type != "cuda" or not pdl_requested():
        return False
    return _capable(device.index if device.index is not None else torch.cuda.current_device())


def pdl_options(device: torch.device) -> dict:
    """The launch arguments of a PDL-aware kernel: its PDL constexpr and Triton's launch_pdl."""
    enabled = use_pdl(device)
    return {"PDL": enabled, "launch_pdl": enabled}


@triton.jit
def pdl_launch_dependents(PDL: tl.constexpr):
    if PDL:
        gdc_launch_dependents()


@triton.jit
def pdl_wait(PDL: tl.constexpr):
    if PDL:
        gdc_wait()
