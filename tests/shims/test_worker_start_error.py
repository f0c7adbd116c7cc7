"""worker_start_error: a worker that fails to start is named, with its own error."""

from __future__ import annotations

import pytest

from speculators_compat.shims.worker_start_error import SHIM
from tests.helpers import run_python

pytestmark = pytest.mark.engine

# A llama-tiny checkpoint whose weights file is cut short (as by a full disk or an interrupted
# copy): safetensors refuses it inside the worker, while the worker starts (load_model). Default
# start method, and spawn (how vLLM starts workers on GPUs once CUDA is initialised: the shim
# reaches those through vLLM's plugin loading).
_RUN = """
import json, os, shutil, sys, tempfile
from pathlib import Path
os.environ.setdefault("SPECULATORS_COMPAT_DTYPE", "float32")
import speculators_compat
from speculators_compat.cpu_alias import ensure_vllm_cpu_alias
ensure_vllm_cpu_alias()
import speculators.data_generation.vllm_hidden_states_generator as gen_module
from speculators_compat.tiny import build

path = Path(tempfile.mkdtemp()) / "llama-tiny-broken"
shutil.copytree(build("llama-tiny"), path)
weights = path / "model.safetensors"
weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 2])
try:
    gen_module.VllmHiddenStatesGenerator(str(path), layer_ids=[1, 2], max_model_len=256)
    out = {"ok": True}
except Exception as exc:
    out = {"ok": False, "type": type(exc).__name__, "mro": [c.__name__ for c in type(exc).__mro__],
           "message": str(exc)[:3000]}
print(json.dumps(out), flush=True)
os._exit(0)
"""
GENERIC = "See stack trace for root cause"


@pytest.mark.parametrize("method", ["default", "spawn"])
def test_the_failing_worker_is_named_with_its_own_error(method):
    env = {"VLLM_WORKER_MULTIPROC_METHOD": "spawn"} if method == "spawn" else {}
    result = run_python(_RUN, env=env)
    assert not result["ok"]
    assert "WorkerError" in result["mro"], result
    assert result["message"].startswith("vLLM worker rank 0, pid "), result["message"][:300]
    # safetensors' own error, raised in the worker
    assert "SafetensorError" in result["message"], result["message"][:1500]
    assert GENERIC not in result["message"]


def test_without_it_the_caller_gets_vllms_generic_message():
    result = run_python(_RUN, env={"SPECULATORS_COMPAT_DISABLE": SHIM.name})
    assert not result["ok"]
    assert GENERIC in result["message"]
    assert "SafetensorError" not in result["message"]
