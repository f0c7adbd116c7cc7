"""Worker side: send a failing worker's exception type, message and traceback to the caller.

vLLM's ``WorkerProc.enqueue_output`` replies ``str(exc)``, and the driver raises
``RuntimeError: Worker failed with error '<that>'``: empty for a bare ``assert`` or a
``KeyError()``, and never with the type or traceback. The shim replaces the exception by one
whose text carries all three (see :mod:`speculators_compat.errors`). It only changes error text.

Probe: ``WorkerProc.enqueue_output`` replies ``str(output)`` for an exception.
"""

from __future__ import annotations

import inspect

from ..shim import Shim, replace_attr
from ..worker_errors import describe
from ._targets import WORKER

NAME = "worker_error_details"
VLLM_MODULE = "vllm.v1.executor.multiproc_executor"


def probe() -> bool:
    from vllm.v1.executor.multiproc_executor import WorkerProc

    method = getattr(WorkerProc, "enqueue_output", None)
    return method is not None and "str(output)" in inspect.getsource(method)


class _Detailed(Exception):
    pass


def patch():
    from vllm.v1.executor.multiproc_executor import WorkerProc

    original = WorkerProc.enqueue_output

    def enqueue_output(self, output):
        if isinstance(output, Exception) and not isinstance(output, _Detailed):
            output = _Detailed(describe(output))
        return original(self, output)

    return replace_attr(WorkerProc, "enqueue_output", enqueue_output, NAME)


SHIM = Shim(
    name=NAME,
    target=f"{VLLM_MODULE}:WorkerProc.enqueue_output",
    vllm=">=0.11",
    symptom="RuntimeError: Worker failed with error '', please check the stack trace above for "
    "the root cause",
    upstream="none found",
    remove_when="never on speculators 0.3.x (a diagnostic neither speculators nor vLLM gives)",
    hook_module=WORKER,  # imported in every worker that runs speculators' extension
    probe=probe,
    patch=patch,
)
