"""kernel_rebind_scan: a vLLM engine starts in a process that imported numba (llvmlite)."""

from __future__ import annotations

import pytest

from speculators_compat.shims.kernel_rebind_scan import SHIM
from tests.helpers import needs_claim, run_python

pytestmark = pytest.mark.engine

_START = """
import json, os
os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
import numba  # llvmlite's ctypes wrappers are now in sys.modules
import speculators_compat
from speculators_compat.oracle.layer_probe import VllmLayerProbe
from speculators_compat.tiny import build
try:
    probe = VllmLayerProbe(build("llama-tiny"))
    print(json.dumps({"ok": True, "layers": probe.num_layers}), flush=True)
except Exception as exc:
    print(json.dumps({"ok": False, "error": f"{type(exc).__name__}: {exc}"}), flush=True)
os._exit(0)  # no engine teardown (os._exit skips flushing: the prints above flush)
"""


def test_without_it_the_engine_does_not_start_after_numba(claimed):
    needs_claim(claimed, SHIM)
    started = run_python(_START)
    assert started["ok"] and started["layers"] > 0, started
    without = run_python(_START, env={"SPECULATORS_COMPAT_DISABLE": SHIM.name})
    assert not without["ok"]
    assert "'_lib_fn_wrapper' object has no attribute 'get'" in without["error"]
