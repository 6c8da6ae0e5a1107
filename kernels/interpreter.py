"""Running the kernels on the CPU through Triton's interpreter (tests, dry runs).

NOTE: triton.jit picks a GPU kernel or an interpreter function at decoration time,
from TRITON_INTERPRET: for Triton's own library (tl.sum, tl.max, ...) when triton is
first imported and for inferq's kernels when their modules are first imported. So
`use_cpu_interpreter()` must run before anything imports triton; this module imports
triton only inside it.
"""

from __future__ import annotations

import os
import sys


def use_cpu_interpreter() -> None:
    """Sets TRITON_INTERPRET=1 and makes Triton 3.6's interpreter work on numpy >= 2.4.

    Raises RuntimeError when triton was already imported without the interpreter.
    """
    if os.environ.get("TRITON_INTERPRET") != "1" and "triton" in sys.modules:
        raise RuntimeError(
            "triton was imported before TRITON_INTERPRET=1 was set, so kernels cannot run on the CPU "
            "interpreter: call kernels.interpreter.use_cpu_interpreter() (or set the variable) first"
        )
    os.environ["TRITON_INTERPRET"] = "1"
    import triton.runtime.interpreter as interpreter

    if getattr(interpreter, "_inferq_index_fix", False):
        return
    patch_tensor = interpreter._patch_lang_tensor

    def patch_tensor_with_scalar_index(tensor, scope):
        # NOTE: Triton 3.6's interpreter holds scalars as 1-element arrays and turns
        # them into loop bounds with int(array), which numpy >= 2.4 refuses
        # (triton-lang/triton#9171, fixed after 3.6): take the element instead.
        patch_tensor(tensor, scope)
        scope.set_attr(tensor, "__index__", lambda self: int(self.handle.data.reshape(-1)[0]))

    interpreter._patch_lang_tensor = patch_tensor_with_scalar_index
    interpreter._inferq_index_fix = True
