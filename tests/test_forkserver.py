"""The harness's fresh processes (tests/forkserver.py): what a forked child and the processes it
spawns keep of fresh interpreters. Every ablation test relies on this."""

from __future__ import annotations

import json
import os
import subprocess
import time

import pytest

from tests.forkserver import SPAWN_ENV, SPAWNS_SERVED
from tests.helpers import _forkserver_socket, fresh


def _needs_the_fork_server() -> None:
    if _forkserver_socket() is None:
        pytest.skip("the fork server is off ($SPECULATORS_COMPAT_TEST_FORK=0, or CUDA is usable)")
    if not SPAWNS_SERVED:
        pytest.skip("this Python's fork-server protocol is not the helper's (3.10-3.12)")


SPAWNED = """
import atexit, json, multiprocessing, os, signal, sys, time

def child(out):
    atexit.register(lambda: open(out + ".atexit", "w").close())
    with open(out, "w") as f:
        json.dump({
            "setting": os.environ.get("SETTING"),
            "ours": sorted(m for m in sys.modules if m.split(".")[0] == "speculators_compat"),
            "torch": "torch" in sys.modules,
            "main": sys.modules["__main__"].__name__,
        }, f)

def sleeper():
    time.sleep(60)

if __name__ == "__main__":
    import speculators_compat  # activated in the parent only, as a user's script does
    out = sys.argv[1]
    context = multiprocessing.get_context("spawn")
    os.environ["SETTING"] = "set before start"
    started = time.perf_counter()
    proc = context.Process(target=child, args=(out,))
    proc.start()
    proc.join(120)
    seconds = time.perf_counter() - started
    killed = context.Process(target=sleeper)
    killed.start()
    os.kill(killed.pid, signal.SIGKILL)
    killed.join(60)
    report = json.load(open(out))
    print(json.dumps({**report, "atexit": os.path.exists(out + ".atexit"), "exitcode": proc.exitcode,
                      "killed": killed.exitcode, "seconds": seconds}), flush=True)
"""


@pytest.mark.parametrize("forked", [True, False], ids=["through-the-helper", "real-spawn"])
def test_a_spawned_process_starts_as_a_spawned_interpreter_does(tmp_path, forked):
    """A ``spawn`` process of a forked child (vLLM's CPU workers are) gets the environment its
    parent has when it starts it, has not imported ``speculators_compat`` before its target runs,
    runs ``atexit`` handlers, and reports exit codes and signals; through the helper it starts
    without importing torch again."""
    if forked:
        _needs_the_fork_server()
    script = tmp_path / "spawner.py"
    script.write_text(SPAWNED)
    env = {**os.environ, SPAWN_ENV: "1" if forked else "0"}
    proc = fresh([str(script), str(tmp_path / "report.json")], env=env, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(proc.stdout.splitlines()[-1])
    assert result["setting"] == "set before start"
    assert result["ours"] == []
    assert result["main"] == "__mp_main__"
    assert result["atexit"] is True
    assert (result["exitcode"], result["killed"]) == (0, -9)
    # the helper's processes have torch imported before they start; a spawned one imports it
    # only if its main does (this one does not)
    assert result["torch"] is forked
    if forked:
        assert result["seconds"] < 5, result


def test_a_spawned_process_of_a_process_that_timed_out_goes_with_it(tmp_path):
    """The helper and what it forks are in the child's process group: a test's timeout kills
    them too (no worker outlives its test)."""
    _needs_the_fork_server()
    script = tmp_path / "hang.py"
    script.write_text(
        "import multiprocessing, os, time\n"
        "def hang():\n"
        "    time.sleep(600)\n"
        "if __name__ == '__main__':\n"
        "    proc = multiprocessing.get_context('spawn').Process(target=hang)\n"
        "    proc.start()\n"
        f"    open({str(tmp_path / 'pid')!r}, 'w').write(str(proc.pid))\n"
        "    proc.join()\n"
    )
    with pytest.raises(subprocess.TimeoutExpired):
        fresh([str(script)], timeout=10)
    pid = int((tmp_path / "pid").read_text())
    for _ in range(50):
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            break
        time.sleep(0.1)
    else:
        pytest.fail(f"the spawned process {pid} outlived the child that timed out")
