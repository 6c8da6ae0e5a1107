"""engine/ops.py and the dispatch modules beside it are where the engine chooses each kernel: no other engine
module imports a kernel from kernels/, only the helpers ops.py's docstring names, which launch nothing."""

from __future__ import annotations

import ast
from pathlib import Path

ENGINE = Path(__file__).resolve().parents[2] / "engine"

# the engine's dispatch modules (engine/*.py): each chooses between kernels and their references
DISPATCH = ("ops.py", "attention_ops.py", "moe_ops.py", "quant_ops.py")

# (module, name) an engine module other than a dispatch module may import from kernels/, and why it is no kernel choice
HELPERS = {
    ("kernels._pdl", "set_pdl"): "the process's PDL switch",
    ("kernels._pdl", "use_pdl"): "whether kernels launch with PDL (a log line)",
    ("kernels.stage_batch", "StagingBuffers"): "pinned host buffers; ops.stage_batch launches the kernel",
    ("kernels.random_sample", "pack_params"): "sampling parameters as the kernel's [5, S] tensor",
    ("kernels.random_sample", "asks_step_0"): "whether a row needs the top-k select (a host predicate)",
    ("kernels.greedy_sample", "masked_rows_finite"): "the sampling kernels' masked finiteness rule, in torch",
    ("kernels.quant_formats", "FP8_BLOCK"): "the fp8 scale block (a constant of the layout)",
    ("kernels.quant_formats", "FP8_MAX"): "the largest e4m3 value (a constant)",
    ("kernels.quant_formats", "NF4_BLOCK"): "the nf4 absmax block (a constant of the layout)",
    ("kernels.quant_formats", "NF4_CODEBOOK"): "the nf4 code values (a constant of the layout)",
    ("kernels.quant_formats", "INT4_SYMMETRIC_ZERO"): "int4's implied zero point (a constant of the layout)",
    ("kernels.quant_formats", "pack_int4"): "packs int4 codes into the layout's bytes (torch, at load)",
    ("kernels.interpreter", "use_cpu_interpreter"): "Triton's CPU interpreter on a rank whose rank 0 runs it (tests)",
}


def kernel_imports(path: Path) -> list[tuple[str, str]]:
    """(module, name) of every import from kernels/ in a file; `import kernels.x` gives (kernels.x, "*")."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "kernels":
            found += [(node.module, alias.name) for alias in node.names]
        elif isinstance(node, ast.Import):
            found += [(alias.name, "*") for alias in node.names if alias.name.split(".")[0] == "kernels"]
    return found


def test_only_dispatch_modules_import_kernels_the_rest_imports_named_helpers():
    outside = {
        str(path.relative_to(ENGINE.parent)): imports
        for path in sorted(ENGINE.rglob("*.py"))
        if path.name not in DISPATCH or path.parent != ENGINE
        if (imports := kernel_imports(path))
    }
    unnamed = {path: [i for i in imports if i not in HELPERS] for path, imports in outside.items()}
    assert not {path: imports for path, imports in unnamed.items() if imports}, unnamed
    for name in DISPATCH:
        assert kernel_imports(ENGINE / name), f"{name} imports the kernels it chooses between"


def test_the_check_sees_a_kernel_imported_elsewhere(tmp_path):
    planted = tmp_path / "layer.py"
    planted.write_text("import torch\nfrom kernels.rms_norm import rms_norm\n\n\ndef f():\n    import kernels.gemv\n")
    imports = kernel_imports(planted)
    assert imports == [("kernels.rms_norm", "rms_norm"), ("kernels.gemv", "*")]
    assert all(i not in HELPERS for i in imports)
