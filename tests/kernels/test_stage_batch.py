"""The staging kernel (a step's batch from the host's pinned buffers into the device's, pending input ids
read from the last step's tokens, changed block-table rows written in place) and the tokens' write back
into pinned memory, against their torch references."""

from __future__ import annotations

import pytest
import torch

from kernels.stage_batch import BLOCK, StagingBuffers, stage_batch, stage_batch_ref
from kernels.write_to_host import write_to_host

ON_GPU = torch.cuda.is_available()


def _host(values: torch.Tensor) -> torch.Tensor:
    return values.pin_memory() if ON_GPU else values.clone()


def _staged(n64: int, num_ids: int, num_pending: int, n32: int, rows: int, width: int, seed: int):
    """Host buffers with `num_pending` of the first num_ids ids staged as -1 - row (and a negative
    value past num_ids, which is not an id and must be copied as it is)."""
    gen = torch.Generator().manual_seed(seed)
    host64 = torch.randint(0, 50_000, (n64 + 40,), generator=gen)
    pending_at = torch.randperm(num_ids, generator=gen)[:num_pending]
    host64[pending_at] = -1 - torch.randint(0, 9, (num_pending,), generator=gen)
    if num_ids < n64:
        host64[num_ids] = -1  # a padding slot: -1 means "no KV write", not a pending id
    host32 = torch.randint(0, 1000, (n32 + rows * width + 24,), generator=gen, dtype=torch.int32)
    pending = torch.randint(0, 50_000, (9,), generator=gen)
    return host64, host32, pending


@pytest.mark.parametrize(
    "n64, num_ids, num_pending, n32, rows, width",
    [(48, 1, 1, 32, 1, 3), (300, 80, 17, 96, 40, 7), (3 * BLOCK + 5, 2 * BLOCK, 200, 2 * BLOCK + 3, 64, 40),
     (20, 4, 0, 16, 0, 0), (17 * BLOCK + 3, 9000, 900, 17 * BLOCK + 1, 130, 131)],
    ids=["batch1", "mixed", "many_programs", "no_pending_no_tables", "programs_take_several_chunks"],
)  # fmt: skip
def test_stage_batch_matches_the_reference(n64, num_ids, num_pending, n32, rows, width, device):
    host64, host32, pending = _staged(n64, num_ids, num_pending, n32, rows, width, seed=n64)
    outs = []
    for fn, on in ((stage_batch, device), (stage_batch_ref, torch.device("cpu"))):
        dev64 = torch.full((n64 + 40,), 7, dtype=torch.int64, device=on)
        dev32 = torch.full((n32 + 8,), 7, dtype=torch.int32, device=on)
        tables = torch.full((rows + 3, width + 5), 7, dtype=torch.int32, device=on)
        h64, h32 = (_host(host64), _host(host32)) if fn is stage_batch else (host64, host32)
        buffers = StagingBuffers(h64, dev64, h32, dev32, tables)
        fn(buffers, n64, num_ids, pending.to(on) if num_pending else None, n32, rows, width)
        outs.append([t.cpu() for t in (dev64, dev32, tables)])
    for got, want in zip(*outs, strict=True):
        assert torch.equal(got, want)
    dev64, dev32, tables = outs[1]
    ids = host64[:num_ids]
    waits = ids < 0
    assert torch.equal(dev64[:num_ids][waits], pending[-1 - ids[waits]])  # the last step's tokens
    assert torch.equal(dev64[num_ids:n64], host64[num_ids:n64])  # past the ids, negatives are data
    assert (dev64[n64:] == 7).all() and (dev32[n32:] == 7).all()  # nothing past the staged heads
    assert torch.equal(tables[:rows, :width], host32[n32 : n32 + rows * width].view(rows, width))
    assert (tables[rows:] == 7).all() and (tables[:, width:] == 7).all()


def test_stage_batch_names_what_it_refuses(device):
    host64, host32 = _host(torch.zeros(32, dtype=torch.int64)), _host(torch.zeros(32, dtype=torch.int32))
    dev64 = torch.zeros(32, dtype=torch.int64, device=device)
    dev32 = torch.zeros(32, dtype=torch.int32, device=device)
    tables = torch.zeros(4, 4, dtype=torch.int32, device=device)
    buffers = StagingBuffers(host64, dev64, host32, dev32, tables)
    with pytest.raises(ValueError, match="dev32 must be torch.int32"):
        stage_batch(StagingBuffers(host64, dev64, host32, dev32.long(), tables), 8, 1, None, 8, 1, 1)
    with pytest.raises(ValueError, match="n64 40"):
        stage_batch(buffers, 40, 1, None, 8, 1, 1)
    with pytest.raises(ValueError, match="table rows exceed tables"):
        stage_batch(buffers, 8, 1, None, 8, 5, 1)
    if ON_GPU:  # the kernel reads the host buffers over PCIe: only pinned memory is mapped
        with pytest.raises(ValueError, match="must be pinned"):
            stage_batch(StagingBuffers(host64.clone(), dev64, host32, dev32, tables), 8, 1, None, 8, 1, 1)


@pytest.mark.parametrize("width", [1, 3, 700])
def test_write_to_host_copies_the_tokens(width, device):
    src = torch.randint(-5, 10**6, (2, width), device=device)
    dst = _host(torch.full((2, width), 7, dtype=torch.int64))
    write_to_host(src, dst)
    if ON_GPU:
        torch.cuda.synchronize()
    assert torch.equal(dst, src.cpu())
    with pytest.raises(ValueError, match="one shape"):
        write_to_host(src, _host(torch.zeros(2, width + 1, dtype=torch.int64)))


def _variants(kernel) -> int:
    return sum(len(cache[0]) for cache in kernel.device_caches.values())


@pytest.mark.skipif(not ON_GPU, reason="compiled variants exist on a GPU only (the interpreter compiles nothing)")
def test_every_size_runs_one_compiled_variant(device):
    """The sizes change every step: a size Triton specialized (1, a multiple of 16, anything else) would
    compile another variant the first time a step met its class, in the middle of serving (2026-11-26:
    the first offline run on a fresh H100 lost 14% to it). One variant must serve them all."""
    from kernels.stage_batch import _stage_kernel
    from kernels.write_to_host import _write_kernel

    shapes = [(48, 1, 1, 32, 1, 3), (300, 80, 17, 96, 40, 7), (64, 16, 3, 16, 16, 16), (17, 17, 0, 33, 0, 0)]
    for n64, num_ids, num_pending, n32, rows, width in shapes:
        host64, host32, pending = _staged(n64, num_ids, num_pending, n32, rows, width, seed=n64)
        dev64 = torch.zeros(n64 + 40, dtype=torch.int64, device=device)
        dev32 = torch.zeros(n32 + 8, dtype=torch.int32, device=device)
        tables = torch.zeros(rows + 3, width + 5, dtype=torch.int32, device=device)
        buffers = StagingBuffers(_host(host64), dev64, _host(host32), dev32, tables)
        stage_batch(buffers, n64, num_ids, pending.to(device) if num_pending else None, n32, rows, width)
    for width in (1, 8, 3, 16):
        write_to_host(torch.zeros(2, width, dtype=torch.int64, device=device), _host(torch.zeros(2, width).long()))
    torch.cuda.synchronize()
    assert (_variants(_stage_kernel), _variants(_write_kernel)) == (1, 1)
