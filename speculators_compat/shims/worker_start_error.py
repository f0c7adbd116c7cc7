"""A vLLM worker that fails to start: the caller gets that worker's own error.

When a worker process fails while it starts (building the model, loading weights, attention
backend selection), vLLM logs the traceback in the worker's output and the caller gets only
``Exception: WorkerProc initialization failed due to an exception in a background process. See
stack trace for root cause.`` On 8 GPUs that log is interleaved with seven others. The shim's
worker side (the worker wrapper's start-up steps: ``init_worker``, ``init_device``,
``load_model``) writes the failing worker's rank, pid and exception (type,
message, traceback; see :mod:`speculators_compat.errors`) into a folder named by
``$SPECULATORS_COMPAT_WORKER_START_ERRORS`` (made by the driver, inherited by its workers); its
driver side (``WorkerProc.wait_for_ready``) raises the first report as the worker's own
exception type (a :class:`~speculators_compat.errors.WorkerError`), naming rank and pid, with
vLLM's exception as its cause. A worker that wrote nothing because it died (a signal, the OOM
killer, a crash in native code) is named with its exit code or signal
(:class:`~speculators_compat.errors.WorkerDied`). It only changes error text.

Probe: ``WorkerProc.wait_for_ready`` raises vLLM's generic "See stack trace for root cause".
"""

from __future__ import annotations

import atexit
import inspect
import os
import shutil
import tempfile
from pathlib import Path

from ..shim import Shim, replace_attr, undo_all
from ..worker_errors import describe, from_text, worker_died
from ._targets import raising_instead

NAME = "worker_start_error"
VLLM_MODULE = "vllm.v1.executor.multiproc_executor"
ENV = "SPECULATORS_COMPAT_WORKER_START_ERRORS"


def probe() -> bool:
    from vllm.v1.executor.multiproc_executor import WorkerProc

    return "See stack trace for root cause" in inspect.getsource(WorkerProc.wait_for_ready)


def _folder() -> Path:
    path = os.environ.get(ENV)
    if not path or not Path(path).is_dir():
        path = tempfile.mkdtemp(prefix="speculators-compat-worker-start-")
        os.environ[ENV] = path  # inherited by the workers this process starts
        atexit.register(shutil.rmtree, path, True)
    return Path(path)


def _reported(folder: Path, pids: set[int]) -> Exception | None:
    """The first report of a worker among ``pids``, as the worker's exception."""
    for report in sorted(folder.glob("*.txt")):
        if int(report.stem.rpartition("-")[2]) not in pids:
            continue  # another executor's worker
        header, _, text = report.read_text().partition("\n")
        err = from_text(text)
        if err is not None:
            err.args = (f"vLLM worker {header} failed to start: {err}",)
            return err
    return None


def _reporting(name: str, original):
    """``original`` (a start-up step of vLLM's worker wrapper), writing its exception down."""

    def step(self, *args, **kwargs):
        try:
            if original is not None:
                return original(self, *args, **kwargs)
            return getattr(self.worker, name)(*args, **kwargs)
        except Exception as exc:
            rank, pid = getattr(self, "rpc_rank", "?"), os.getpid()
            folder = os.environ.get(ENV)
            if folder and Path(folder).is_dir():
                report = Path(folder) / f"rank{rank}-{pid}.txt"
                report.write_text(f"rank {rank}, pid {pid}\n" + describe(exc))
            raise

    step.__name__ = step.__qualname__ = name
    return step


def patch():
    from vllm.v1.executor import multiproc_executor

    WorkerProc = multiproc_executor.WorkerProc
    wrapper = multiproc_executor.WorkerWrapperBase
    _folder()  # before any worker starts, so that they inherit it
    original_wait = inspect.getattr_static(WorkerProc, "wait_for_ready").__func__

    def reported(exc, unready_proc_handles, *_):
        pids = {h.proc.pid for h in unready_proc_handles if getattr(h, "proc", None) is not None}
        return _reported(_folder(), pids) or worker_died(unready_proc_handles, "while starting")

    wait_for_ready = raising_instead(original_wait, reported)

    # The worker's start-up steps after vLLM loads its plugins (in WorkerWrapperBase.__init__,
    # which is how a spawned worker gets the shims at all). load_model reaches the worker
    # through the wrapper's __getattr__: the method added here delegates the same way.
    undos = [
        replace_attr(wrapper, name, _reporting(name, vars(wrapper).get(name)), NAME)
        for name in ("init_worker", "init_device", "load_model")
    ]
    undos.append(replace_attr(WorkerProc, "wait_for_ready", staticmethod(wait_for_ready), NAME))
    return undo_all(undos)


SHIM = Shim(
    name=NAME,
    target=f"{VLLM_MODULE}:WorkerWrapperBase.init_worker/init_device/load_model, "
    f"{VLLM_MODULE}:WorkerProc.wait_for_ready",
    vllm=">=0.11",
    symptom="Exception: WorkerProc initialization failed due to an exception in a background "
    "process. See stack trace for root cause.",
    upstream="none found",
    remove_when="never on speculators 0.3.x (a diagnostic neither speculators nor vLLM gives)",
    hook_module=VLLM_MODULE,
    probe=probe,
    patch=patch,
)
