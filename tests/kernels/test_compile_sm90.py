"""Every kernel compiles for an H100 (sm_90) here, without a GPU (bench/compile_check.py): the CPU
interpreter runs Python and accepts code that Triton's compiler rejects, which would otherwise first
fail in a device call. The kernels must also compile without register spills, but for the known ones."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
# Known and left so far: prefill attention's 4-warp tiles, the pointer one and the TMA one of 64-token blocks
# (both measured faster anyway than the tiles that do not spill: its _tile_config), and the KV store at the
# engine's 8-warp tile, which stores 6 values to the stack in its prologue (the decode path writes K/V with
# rope_store_kv instead; the KV store's 67% at 4096 x 2048 may owe something to it).
KNOWN_SPILLS = {
    ("prefill_attention._prefill_kernel", "queries < 4k"),
    ("prefill_attention._prefill_kernel", "64-token blocks, TMA"),
    ("kv_store._store_kv_kernel", ""),
}


def test_every_kernel_compiles_for_sm90_and_the_decode_path_does_not_spill():
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}  # compiled kernels, not the interpreter
    done = subprocess.run([sys.executable, "-m", "bench.compile_check"], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=300)  # fmt: skip
    rows = [line.split(" | ") for line in done.stdout.splitlines()[1:]]
    failed = [r for r in rows if r[0] != "ok"]
    assert done.returncode == 0 and not failed and rows, f"{failed or done.stdout}\n{done.stderr[-3000:]}"
    assert len(rows) >= 17
    spilling = {(kernel, label) for _, kernel, label, _, spills, _ in rows if int(spills) > 0}
    assert spilling <= KNOWN_SPILLS, f"register spills in the SASS: {sorted(spilling - KNOWN_SPILLS)}"
