"""Triton kernels of inferq, each beside its plain-torch reference (`<name>_ref`).

Imports only torch and triton. The engine picks the kernel or the reference
through `engine.ops` and the dispatch modules beside it. Shared pieces: `_launch` (the launchers' argument checks),
`_online_softmax` (the attention kernels' softmax step), `decode_grid` (the shape of
decode attention's grid) and `interpreter` (running the kernels on the CPU through
Triton's interpreter, for tests and dry runs).
Measured figures: docs/benchmarks.md (`python -m bench.kernels`); why each tile and fusion: docs/decisions/.
"""
