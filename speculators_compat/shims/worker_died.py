"""A vLLM worker that dies during ``generate()``: the caller learns which one, and how.

When a worker process of the generator's executor ends while ``generate()`` waits on it (killed
by a signal, by the OOM killer, a crash in a native kernel), vLLM's worker monitor shuts the
executor down and the caller gets ``RuntimeError: cancelled`` (about 0.2 s after a SIGKILL), or
``RuntimeError: Executor failed.`` on the next call: nothing says which worker died or why. The
shim wraps ``generate`` and, when it fails while a worker of its executor has ended, raises
:class:`~speculators_compat.errors.WorkerDied` naming each ended worker (rank, pid, exit code or
signal, the first to fail first) with vLLM's error as its cause. Errors with every worker alive
pass through unchanged. Nothing is retried; the pipeline keeps what it had written (resume).

Probe: vLLM's worker monitor logs "died unexpectedly" (and the caller gets only "cancelled" /
"Executor failed.").
"""

from __future__ import annotations

import inspect

from ..shim import Shim, replace_attr
from ..worker_errors import worker_died
from ._targets import GENERATOR, module, raising_instead

NAME = "worker_died"


def probe() -> bool:
    from vllm.v1.executor import multiproc_executor

    # vLLM's worker monitor notices the death (it logs "died unexpectedly") and shuts the
    # executor down; what the caller then gets is generic
    return "died unexpectedly" in inspect.getsource(multiproc_executor)


def patch():
    cls = module(GENERATOR).VllmHiddenStatesGenerator

    def named(exc, generator, *_):
        workers = getattr(getattr(generator, "executor", None), "workers", None) or []
        return worker_died(workers, "during generate()")

    generate = raising_instead(cls.generate, named)
    return replace_attr(cls, "generate", generate, NAME)


SHIM = Shim(
    name=NAME,
    target=f"{GENERATOR}:VllmHiddenStatesGenerator.generate",
    vllm=">=0.11",
    symptom="RuntimeError: cancelled (or: Executor failed.) when a worker dies, naming none",
    upstream="none filed",
    remove_when="never on speculators 0.3.x (a diagnostic neither speculators nor vLLM gives)",
    hook_module=GENERATOR,
    probe=probe,
    patch=patch,
)
