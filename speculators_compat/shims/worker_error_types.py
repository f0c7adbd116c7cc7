"""Driver side: re-raise a worker's error as its own type, with the worker's traceback.

Pairs with ``worker_error_details``: where the worker sent a marked error text, the generator's
executor raises :class:`speculators_compat.errors.WorkerError`, which is also an instance of the
worker's exception type (``except ValueError`` catches a worker's ``ValueError``; ``except
RuntimeError`` still catches it, as before).

Probe: vLLM raises worker failures as a plain ``RuntimeError("Worker failed with error ...")``.
"""

from __future__ import annotations

import inspect

from ..shim import Shim, replace_attr
from ..worker_errors import from_text
from ._targets import GENERATOR, compat_executor_class, inherited, raising_instead

NAME = "worker_error_types"


def probe() -> bool:
    from vllm.v1.executor import multiproc_executor

    return "Worker failed with error" in inspect.getsource(multiproc_executor)


def patch():
    cls = compat_executor_class()
    base = inherited(cls, "collective_rpc")
    collective_rpc = raising_instead(base, lambda exc, *_: from_text(str(exc)), RuntimeError)
    return replace_attr(cls, "collective_rpc", collective_rpc, NAME)


SHIM = Shim(
    name=NAME,
    target=f"{GENERATOR}:MultiprocExecutor.collective_rpc",
    vllm=">=0.11",
    symptom="RuntimeError: Worker failed with error '...': the worker's exception type and "
    "traceback are lost",
    upstream="none filed",
    remove_when="never on speculators 0.3.x (a diagnostic neither speculators nor vLLM gives)",
    hook_module=GENERATOR,
    probe=probe,
    patch=patch,
    requires=("generator_executor", "worker_error_details"),
)
