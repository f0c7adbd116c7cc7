"""Errors raised in vLLM worker processes, carried to the caller with their type and traceback.

vLLM sends a worker's exception to the driver as ``str(exc)`` only, which is empty for a bare
``assert`` or ``KeyError()``: the caller sees ``RuntimeError: Worker failed with error ''``. The
worker side (``worker_error_details``) sends the type, message and traceback in one marked text;
the driver side (``worker_error_types``) turns that text back into an exception that is an
instance of :class:`WorkerError` *and*, where possible, of the worker's exception type.
"""

from __future__ import annotations

import builtins
import importlib
import re
import signal
import traceback
from multiprocessing.connection import wait

MARKER = "[speculators_compat worker error]"
_PARSE = re.compile(
    re.escape(MARKER) + r" (?P<type>[\w.]+): (?P<message>.*?)\n--- worker traceback ---\n(?P<tb>.*)",
    re.S,
)


class WorkerError(RuntimeError):
    """An exception raised in a vLLM worker process."""

    def __init__(self, type_name: str, message: str, worker_traceback: str):
        super().__init__(
            f"{type_name} in a vLLM worker: {message}\n--- worker traceback ---\n{worker_traceback}"
        )
        self.type_name = type_name
        self.message = message
        self.worker_traceback = worker_traceback


def describe(exc: BaseException) -> str:
    """The marked text a worker sends for ``exc``."""
    kind = type(exc)
    name = kind.__qualname__ if kind.__module__ == "builtins" else f"{kind.__module__}.{kind.__qualname__}"
    tb = "".join(traceback.format_exception(kind, exc, exc.__traceback__))
    # vLLM adds the traceback as a note (Python 3.11+); keep only notes that say something else.
    notes = [n for n in getattr(exc, "__notes__", []) if not n.startswith("Traceback") and n not in tb]
    return f"{MARKER} {name}: {exc}\n--- worker traceback ---\n{tb}{''.join(notes)}"


def _resolve(type_name: str) -> type | None:
    if "." not in type_name:
        found = getattr(builtins, type_name, None)
    else:
        module, _, attr = type_name.rpartition(".")
        try:
            found = importlib.import_module(module)
            for part in attr.split("."):
                found = getattr(found, part)
        except (ImportError, AttributeError):
            found = None
    return found if isinstance(found, type) and issubclass(found, Exception) else None


def from_text(text: str) -> WorkerError | None:
    """Rebuild the worker's exception from a driver-side error message, if it carries one."""
    match = _PARSE.search(text)
    if not match:
        return None
    type_name, message, tb = match["type"], match["message"], match["tb"].rstrip("' \n")
    tb = tb.removesuffix("', please check the stack trace above for the root cause").rstrip()
    original = _resolve(type_name)
    cls = WorkerError
    if original is not None and not issubclass(WorkerError, original):
        try:
            cls = type(f"Worker{original.__name__}", (WorkerError, original), {})
        except TypeError:  # incompatible layouts (e.g. OSError): keep the plain WorkerError
            cls = WorkerError
    err = cls.__new__(cls)
    WorkerError.__init__(err, type_name, message, tb)
    return err


class WorkerDied(RuntimeError):
    """A vLLM worker process ended (a signal, the OOM killer, a crash in a kernel, an exit) while
    the caller waited on it. ``workers`` holds ``(rank, pid, exitcode)`` of each ended worker,
    the unexpected ones first."""

    def __init__(self, message: str, workers: list[tuple[int, int, int]]):
        super().__init__(message)
        self.workers = workers


def exit_text(exitcode: int) -> str:
    """``exitcode`` as :mod:`multiprocessing` reports it (negative: the signal), in words."""
    if exitcode < 0:
        try:
            name = signal.Signals(-exitcode).name
        except ValueError:
            name = "unknown signal"
        hint = " (the OOM killer sends this one: see `dmesg`)" if -exitcode == signal.SIGKILL else ""
        return f"killed by signal {-exitcode} ({name}){hint}"
    return f"exit code {exitcode}"


def worker_died(handles, doing: str) -> WorkerDied | None:
    """A :class:`WorkerDied` naming every process among vLLM's worker ``handles`` (objects with
    ``.proc`` and ``.rank``) that has ended, or None if all are alive. ``doing``: what the caller
    was waiting for ("to start", "during generate()")."""
    procs = [(getattr(h, "rank", "?"), h.proc) for h in handles if getattr(h, "proc", None) is not None]
    # a worker whose pipe just closed may not have ended yet: give it a moment (not per worker)
    wait([proc.sentinel for _, proc in procs], timeout=1.0)
    ended = [(rank, proc.pid, proc.exitcode) for rank, proc in procs if proc.exitcode is not None]
    if not ended:
        return None
    # The worker that failed first, not those vLLM stopped after it (SIGTERM, or a clean exit).
    ended.sort(key=lambda w: w[2] in (0, -signal.SIGTERM))
    named = "; ".join(f"rank {r}, pid {p}: {exit_text(c)}" for r, p, c in ended)
    return WorkerDied(
        f"vLLM worker rank {ended[0][0]} (pid {ended[0][1]}) died {doing}: {named}. "
        "Its last output is in the worker log above.",
        ended,
    )
