"""The PDL contract of kernels/_pdl.py, read from the kernels' source: a kernel launched early may
touch nothing that an earlier kernel writes before its `griddepcontrol.wait`, and a wrong order
corrupts results only sometimes, on a GPU, under load. So every kernel that takes a PDL flag is
checked here, on any machine:

- its first statement is `pdl_launch_dependents(PDL)`;
- `pdl_wait(PDL)` comes once, as a statement of the kernel's own body (never inside a branch or loop);
- before it, the only loads are of what no kernel of the step writes: model weights (WEIGHT_POINTERS),
  tables of the model (CONSTANT_TABLES) and the step's metadata, which the host stages before the step's
  first kernel (STEP_METADATA), each followed through the kernel's local names; the only helpers called
  are those that load such pointers (METADATA_HELPERS), and decode attention's `load_kv_tile` of the
  positions before each sequence's newest (a key mask named `earlier`, built from `seq_len - 1`);
  there is no store or atomic.

And every launcher passes `pdl_options(...)` to each kernel that takes the flag, so that the PDL
constexpr and Triton's launch attribute never disagree.
"""

from __future__ import annotations

import ast
import importlib
import inspect
import pkgutil
import textwrap

import pytest

import kernels

WEIGHT_POINTERS = {"w_ptr", "w_rows", "up_rows"}  # weights: never written by a kernel during inference
CONSTANT_TABLES = {"cos_sin_ptr"}  # the rotary table: built at load, never written after
# Staged by the host into the step's device buffers (engine/input_batch.py) before the step's first
# kernel, which is a torch op launched without PDL: complete before any PDL kernel of the step starts.
# The decode kernel's order of the sequences is sorted from the staged lengths by a torch op before the
# forward (engine.attention_ops.decode_order; tests/engine/test_pdl_engine_invariants.py checks where it is made).
STEP_METADATA = {"pos_ptr", "slot_ptr", "seq_lens_ptr", "block_tables_ptr", "order_ptr"}
READABLE_BEFORE_WAIT = WEIGHT_POINTERS | CONSTANT_TABLES | STEP_METADATA
# Helpers that load only their pointer arguments: allowed where every pointer they get is readable.
METADATA_HELPERS = {"token_tile_slots", "load_cos_sin"}
POOL_POINTERS = {"k_cache_ptr", "v_cache_ptr"}
# Calls allowed before the wait: index arithmetic and the loads themselves.
SAFE_CALLS = {"arange", "program_id", "num_programs", "zeros", "full", "cdiv", "minimum", "maximum", "to", "load"}


def _kernel_modules():
    for info in pkgutil.iter_modules(kernels.__path__):
        if info.name not in ("_pdl", "interpreter"):
            yield importlib.import_module(f"kernels.{info.name}")


def _pdl_kernels():
    """(module, name, function AST) of every Triton kernel with a PDL parameter."""
    found = []
    for module in _kernel_modules():
        for name, obj in vars(module).items():
            fn = getattr(obj, "fn", None)
            if fn is None or getattr(fn, "__module__", None) != module.__name__:
                continue
            tree = ast.parse(textwrap.dedent(inspect.getsource(fn)))
            func = tree.body[0]
            if isinstance(func, ast.FunctionDef) and "PDL" in [a.arg for a in func.args.args]:
                found.append((module, name, func))
    return found


PDL_KERNELS = _pdl_kernels()


def _call_name(call: ast.Call) -> str:
    target = call.func
    return target.attr if isinstance(target, ast.Attribute) else getattr(target, "id", "")


def _is_call_of(statement: ast.stmt, name: str) -> bool:
    call = statement.value if isinstance(statement, ast.Expr) else None
    return isinstance(call, ast.Call) and _call_name(call) == name


def test_every_kernel_but_prefill_attention_takes_part():
    names = {f"{module.__name__}.{name}" for module, name, _ in PDL_KERNELS}
    assert len(names) >= 12, names
    assert not any("prefill_attention" in n for n in names)


def _pointer_roots(node: ast.AST, aliases: dict[str, set[str]]) -> set[str]:
    """The kernel arguments a pointer expression is built from, through earlier local assignments."""
    roots: set[str] = set()
    for name in (n.id for n in ast.walk(node) if isinstance(n, ast.Name)):
        roots |= aliases.get(name, {name})
    return {r for r in roots if r.endswith(("_ptr", "_rows"))}


@pytest.mark.parametrize("module,name,func", PDL_KERNELS, ids=[f"{m.__name__}.{n}" for m, n, _ in PDL_KERNELS])
def test_nothing_a_kernel_of_the_step_writes_is_touched_before_the_wait(module, name, func):
    body = [s for s in func.body if not (isinstance(s, ast.Expr) and isinstance(s.value, ast.Constant))]
    assert _is_call_of(body[0], "pdl_launch_dependents"), f"{name}: pdl_launch_dependents(PDL) must come first"
    waits = [i for i, s in enumerate(body) if _is_call_of(s, "pdl_wait")]
    nested = [n for n in ast.walk(func) if isinstance(n, ast.Call) and _call_name(n) == "pdl_wait"]
    assert len(waits) == 1 and len(nested) == 1, f"{name}: one pdl_wait(PDL), in the kernel's own body"
    aliases: dict[str, set[str]] = {}
    assignments: dict[str, str] = {}
    for statement in body[1 : waits[0]]:
        for node in ast.walk(statement):
            if not isinstance(node, ast.Call):
                continue
            called = _call_name(node)
            where = f"{name}: {called}() before pdl_wait (line {node.lineno})"
            if called in METADATA_HELPERS:
                pointers = set().union(*(_pointer_roots(a, aliases) for a in node.args))
                assert pointers <= READABLE_BEFORE_WAIT, f"{where} reads {sorted(pointers)}"
            elif called == "load_kv_tile":
                # decode attention's first tile: positions before the step's fresh keys (its newest, and a verification
                # step's decode rows' k more: engine/verify_rows.py), which earlier steps stored
                pool = _pointer_roots(node.args[0], aliases)
                assert pool <= POOL_POINTERS, f"{where} reads {sorted(pool)}"
                mask = node.args[4]
                assert isinstance(mask, ast.Name) and mask.id == "earlier", f"{where}: its key mask must be `earlier`"
                assert "first_kpos < seq_len - FRESH_KEYS" in assignments.get("earlier", ""), (
                    f"{name}: `earlier` must stop before the step's fresh keys"
                )
            else:
                assert called in SAFE_CALLS, where
                if called == "load":
                    pointers = _pointer_roots(node.args[0], aliases)
                    assert pointers and pointers <= READABLE_BEFORE_WAIT, (
                        f"{name}: loads {sorted(pointers)} before pdl_wait (line {node.lineno}); only weights, model "
                        "tables and the step's metadata may be"
                    )
        if isinstance(statement, ast.Assign):
            roots = _pointer_roots(statement.value, aliases)
            for target in statement.targets:
                for target_name in (n.id for n in ast.walk(target) if isinstance(n, ast.Name)):
                    aliases[target_name] = roots
                    assignments[target_name] = ast.unparse(statement.value)


def test_every_launch_of_a_pdl_kernel_passes_pdl_options():
    for module in {m for m, _, _ in PDL_KERNELS}:
        tree = ast.parse(inspect.getsource(module))
        kernel_names = {n for m, n, _ in PDL_KERNELS if m is module}
        launches = [
            node
            for node in ast.walk(tree)
            if isinstance(node, ast.Call)
            and isinstance(node.func, ast.Subscript)
            and getattr(node.func.value, "id", None) in kernel_names
        ]
        assert launches, module.__name__
        for launch in launches:
            spread = [k.value for k in launch.keywords if k.arg is None]
            assert any(isinstance(v, ast.Call) and _call_name(v) == "pdl_options" for v in spread), (
                f"{module.__name__}: {launch.func.value.id} launched without **pdl_options(...) (line {launch.lineno})"
            )
