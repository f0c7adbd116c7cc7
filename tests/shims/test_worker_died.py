"""worker_died: a worker killed during generate() is named (rank, pid, signal), within seconds."""

from __future__ import annotations

import pytest

from speculators_compat.shims.worker_died import SHIM
from tests.helpers import run_python

pytestmark = pytest.mark.engine

# A real worker process killed with SIGKILL (what the OOM killer sends) while generate() runs a
# batch long enough to be under way; then, with the executor shut down, the next call.
_RUN = """
import json, os, signal, sys, threading, time
os.environ.setdefault("SPECULATORS_COMPAT_DTYPE", "float32")
import speculators_compat
from speculators_compat.cpu_alias import ensure_vllm_cpu_alias
ensure_vllm_cpu_alias()
import speculators.data_generation.vllm_hidden_states_generator as gen_module
from speculators_compat.tiny import build

TP, VICTIM = int(sys.argv[1]), int(sys.argv[2])


def attempt(gen, ids):
    start = time.monotonic()
    try:
        gen.generate(ids)
        return {"ok": True, "seconds": time.monotonic() - start}
    except Exception as exc:
        return {"ok": False, "type": type(exc).__name__, "mro": [c.__name__ for c in type(exc).__mro__],
                "message": str(exc)[:2000], "workers": getattr(exc, "workers", None),
                "seconds": time.monotonic() - start}


gen = gen_module.VllmHiddenStatesGenerator(
    str(build("llama-tiny")), layer_ids=[1, 2], max_model_len=512, tensor_parallel_size=TP
)
gen.generate([[1, 2, 3, 4]])  # it works
victim = next(h.proc for h in gen.executor.workers if h.rank == VICTIM)
batch = [[(7 * i + j) % 500 + 1 for j in range(400)] for i in range(256)]
threading.Timer(0.5, os.kill, (victim.pid, signal.SIGKILL)).start()
during = attempt(gen, batch)
after = attempt(gen, [[1, 2, 3]])
print(json.dumps({"ok": True, "victim": victim.pid, "during": during, "after": after}), flush=True)
os._exit(0)
"""


def _run(tp: int, victim: int, env: dict | None = None) -> dict:
    env = dict(env or {})
    if tp > 1:
        env["VLLM_CPU_OMP_THREADS_BIND"] = "|".join(str(i) for i in range(tp))
    return run_python(_RUN.replace("sys.argv[1]", str(tp)).replace("sys.argv[2]", str(victim)), env=env)


@pytest.mark.parametrize(("tp", "victim"), [(1, 0), (2, 1)], ids=["tp1", "tp2-rank1"])
def test_a_killed_worker_is_named_with_its_signal(tp, victim):
    import os

    if tp > (os.cpu_count() or 1):
        pytest.skip(f"tensor parallel {tp} needs {tp} cores")
    result = _run(tp, victim)
    for call in ("during", "after"):
        outcome = result[call]
        assert not outcome["ok"], f"{call}: generate() succeeded although rank {victim} was killed"
        assert "WorkerDied" in outcome["mro"], outcome
        assert (
            f"vLLM worker rank {victim} (pid {result['victim']}) died during generate()"
            in (outcome["message"])
        ), outcome["message"]
        assert "killed by signal 9 (SIGKILL)" in outcome["message"]
        assert outcome["workers"][0] == [victim, result["victim"], -9]
        assert outcome["seconds"] < 30, outcome  # within seconds, never a hang


def test_without_it_the_caller_is_not_told_which_worker_died():
    result = _run(1, 0, env={"SPECULATORS_COMPAT_DISABLE": SHIM.name})
    outcome = result["during"]
    assert not outcome["ok"]
    assert "WorkerDied" not in outcome["mro"]
    assert str(result["victim"]) not in outcome["message"], outcome["message"]
