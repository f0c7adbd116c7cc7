"""What the benchmarks share: the tiny fixture, its sequences, child processes, the report.

Every benchmark compares two things measured in the same run, on the same machine, model, inputs
and engine settings, each side in a fresh child process (so one side's engine, caches and
threads never slow the other), and prints the ratio.
"""

from __future__ import annotations

import contextlib
import json
import os
import platform
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# The checkout's speculators_compat, in this process as in the children (PYTHONPATH below).
sys.path.insert(0, str(ROOT))
RESULT = "BENCH-RESULT "

# What every child needs to run vLLM's CPU backend on a tiny model (the tox envs set the same).
ENGINE_ENV = {
    "VLLM_MLA_DISABLE": "1",
    "VLLM_CPU_KVCACHE_SPACE": "1",
    "VLLM_LOGGING_LEVEL": "WARNING",
    "TOKENIZERS_PARALLELISM": "false",
    "HF_HUB_OFFLINE": "1",
    "TRANSFORMERS_OFFLINE": "1",
}


def child_env(**extra: str) -> dict[str, str]:
    env = {**os.environ, **{k: v for k, v in ENGINE_ENV.items() if k not in os.environ}, **extra}
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH", "")) if p)
    return env


def run_child(args: list[str], env: dict[str, str] | None = None, timeout: float = 1800) -> dict:
    """Run ``python args...``; return the JSON it printed after RESULT, plus its wall time.

    Output goes to files, not pipes: vLLM leaves helper processes (multiprocessing's resource
    tracker) that inherit the child's stdout and outlive it, and a pipe would wait for them.
    The child runs in a session of its own, and whatever it leaves running when it returns is
    killed: a child that leaves through ``os._exit`` leaves ``vllm.LLM``'s engine-core process
    behind, and a leftover engine slows every later measurement.
    """
    with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err:
        start = time.perf_counter()
        proc = subprocess.Popen(
            [sys.executable, *args],
            stdout=out,
            stderr=err,
            env=env or child_env(),
            cwd=ROOT,
            start_new_session=True,
        )
        try:
            proc.wait(timeout=timeout)
        finally:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        wall = time.perf_counter() - start
        out.seek(0)
        err.seek(0)
        stdout, stderr = out.read(), err.read()
    lines = [line[len(RESULT) :] for line in stdout.splitlines() if line.startswith(RESULT)]
    if proc.returncode != 0 or not lines:
        raise RuntimeError(
            f"benchmark child {' '.join(args)} failed (exit {proc.returncode}):\n"
            f"{stdout[-2000:]}\n{stderr[-4000:]}"
        )
    return {**json.loads(lines[-1]), "wall_s": wall}


def emit(result: dict) -> None:
    """A child's answer to its parent (one line)."""
    print(RESULT + json.dumps(result), flush=True)


def fixture(recipe: str, dtype: str = "float32") -> Path:
    from speculators_compat.tiny import build

    return build(recipe, dtype)


def sequences(path: Path, n: int) -> list[list[int]]:
    """``n`` chat-templated token sequences (the embedded conversations, repeated if needed)."""
    from speculators_compat.tiny import load_chat, sample_token_ids

    available = len(load_chat())
    out: list[list[int]] = []
    while len(out) < n:
        out += sample_token_ids(path, min(available, n - len(out)))
    return out


def machine() -> str:
    from speculators_compat.versions import installed_versions

    v = installed_versions()
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return (
        f"vLLM {v.vllm}, speculators {v.speculators}, torch {v.torch}, transformers {v.transformers}; "
        f"Python {platform.python_version()}, {platform.machine()}, {cpus} CPUs, no GPU"
    )


def header(title: str, goal: str) -> None:
    print(f"\n== {title}\n   goal: {goal}\n   {machine()}", flush=True)


def verdict(ok: bool) -> str:
    return "meets the goal" if ok else "MISSES the goal"
