"""The vllm.general_plugins entry point: worker processes started by spawn apply the shims
through it, and a vLLM process that never imported speculators_compat is left alone."""

from __future__ import annotations

import importlib.metadata as md

import pytest

from tests.helpers import run_generator, run_python

pytestmark = pytest.mark.engine

SPAWN = {"VLLM_WORKER_MULTIPROC_METHOD": "spawn"}


def test_the_entry_point_is_installed():
    names = {ep.name: ep.value for ep in md.entry_points(group="vllm.general_plugins")}
    assert names.get("speculators_compat") == "speculators_compat_plugin:register"


def test_spawned_workers_capture_through_the_plugin_and_fail_without_it():
    with_plugin = run_generator("deepseek-v3-tiny", 4, env=SPAWN)
    assert with_plugin["ok"], with_plugin.get("message")
    assert max(with_plugin["errors"]) <= 5e-3
    # vLLM loads only the plugins VLLM_PLUGINS names: without ours, a spawned worker runs
    # speculators 0.3.0's own capture, which refuses DeepSeek.
    without = run_generator("deepseek-v3-tiny", 4, env={**SPAWN, "VLLM_PLUGINS": "no_such_plugin"})
    assert not without["ok"]
    # the worker's own error, as speculators' capture meets it (0.32: DeepSeek passes the gate,
    # and under transformers 5 speculators does not even import there without the shims), or
    # vLLM's generic one; a worker that logs its failure and returns (vLLM's worker_main) exits with
    # code 0, and where it has exited by the time the driver looks (fast where the worker does not
    # tear down a whole interpreter: a fork, the harness's spawn helper), the caller is told so.
    assert (
        "does not support hidden state extraction" in without["message"]
        or "get_input_embeddings" in without["message"]
        or "WorkerProc initialization failed" in without["message"]
        or "died while starting: rank 0" in without["message"]
    ), without["message"]


# A plain vLLM user's process on a machine where speculators-compat is installed: vLLM loads every
# vllm.general_plugins entry point in it (and in its engine process). Nothing of ours may load,
# and no attribute of vLLM or speculators may be ours, even after speculators' generator module
# is imported (the shims' hooks would patch it).
_PLAIN = """
import inspect, json, sys
from vllm import LLM

llm = LLM(model={path!r}, dtype="float32", enforce_eager=True, max_model_len=256, max_num_seqs=2,
          block_size={block}, seed=0)


def ours(_=None):
    import sys
    names = ("speculators_compat", "speculators_compat_plugin")
    return sorted(m for m in sys.modules if m.split(".")[0] in names)


engine = llm.collective_rpc(ours)
try:
    import speculators.data_generation.vllm_hidden_states_generator  # noqa: F401
except Exception:  # transformers 5: speculators 0.3.0 imports only with our shim (by design)
    pass

marked = []
for name, mod in list(sys.modules.items()):
    if mod is None or not name.startswith(("vllm", "speculators")):
        continue
    for attr, value in list(vars(mod).items()):
        owners = [(attr, value)]
        if isinstance(value, type):
            owners += [(attr + "." + k, v) for k, v in vars(value).items()]
        marked += [name + ":" + a for a, v in owners if inspect.getattr_static(v, {mark!r}, None)]
print(json.dumps({{"here": ours(), "engine": engine, "marked": sorted(set(marked))}}), flush=True)
"""


def test_a_plain_vllm_process_loads_nothing_of_ours(built):
    from speculators_compat.registry import ACTIVE_ENV
    from speculators_compat.shim import MARK
    from speculators_compat.shims.cpu_attention_block_size import cpu_block_size

    code = _PLAIN.format(path=str(built("llama-tiny")), block=cpu_block_size(), mark=MARK)
    # no SPECULATORS_COMPAT_ACTIVE: this process did not start from one that imported us
    # (callables for collective_rpc cross to the engine process only with insecure serialization)
    result = run_python(code, env={ACTIVE_ENV: None, "VLLM_ALLOW_INSECURE_SERIALIZATION": "1"})
    # vLLM did load our entry point (in both processes), and it imported nothing else of ours
    assert result["here"] == ["speculators_compat_plugin"], result["here"]
    assert result["engine"] == [["speculators_compat_plugin"]], result["engine"]
    assert result["marked"] == [], result["marked"]
