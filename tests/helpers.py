"""Helpers for tests that need a fresh Python process."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap


def run_python(code: str, env: dict[str, str | None] | None = None, timeout: float = 600) -> dict:
    """Run ``code`` in a fresh interpreter; it must print one JSON line last. Returns that.
    ``env`` adds to this process's environment; a value of None removes the variable.

    The child's stdout is a pipe, so block-buffered: a child that ends with ``os._exit`` must
    print its line with ``flush=True`` (``PYTHONUNBUFFERED`` in a developer's shell hides this).
    """
    full_env = {k: v for k, v in {**os.environ, **(env or {})}.items() if v is not None}
    proc = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        capture_output=True,
        text=True,
        env=full_env,
        timeout=timeout,
    )
    if proc.returncode != 0:
        raise AssertionError(f"subprocess failed ({proc.returncode}):\n{proc.stderr[-4000:]}")
    lines = [line for line in proc.stdout.splitlines() if line.startswith("{")]
    if not lines:
        raise AssertionError(
            "no JSON line in output (printed without flush before os._exit?):\n"
            f"{proc.stdout[-2000:]}\n{proc.stderr[-2000:]}"
        )
    return json.loads(lines[-1])


def run_generator(
    model: str,
    count: int,
    disable: str = "",
    chunked: bool = False,
    worker_assert: bool = False,
    tensor_parallel: int = 1,
    env: dict[str, str] | None = None,
    timeout: float = 600,
) -> dict:
    """tests/shims/run_generator.py in a fresh process, with ``disable``d shims."""
    from pathlib import Path

    args = [sys.executable, "-m", "tests.shims.run_generator", model, str(count)]
    if chunked:
        args.append("--chunked")
    if worker_assert:
        args.append("--worker-assert")
    env = {**os.environ, "SPECULATORS_COMPAT_DISABLE": disable, **(env or {})}
    if tensor_parallel > 1:
        args += ["--tp", str(tensor_parallel)]
        # vLLM's CPU workers bind OpenMP threads per NUMA node by default and refuse a second
        # worker on a single-node machine; one core per worker instead.
        env.setdefault("VLLM_CPU_OMP_THREADS_BIND", "|".join(str(i) for i in range(tensor_parallel)))
    proc = subprocess.run(
        args, capture_output=True, text=True, env=env, timeout=timeout, cwd=Path(__file__).parents[1]
    )
    lines = [line for line in proc.stdout.splitlines() if line.startswith('{"ok"')]
    if not lines:
        raise AssertionError(
            f"no result line ({proc.returncode}):\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
        )
    # what vLLM's workers logged (their errors go to stdout), for a symptom that only they print
    return {**json.loads(lines[-1]), "output": proc.stdout[-20000:]}


def run_draft(mode: str, disable: str = "", timeout: float = 600) -> dict:
    """tests/shims/run_draft.py MODE in a fresh process, with ``disable``d shims."""
    from pathlib import Path

    env = {**os.environ, "SPECULATORS_COMPAT_DISABLE": disable}
    proc = subprocess.run(
        [sys.executable, "-m", "tests.shims.run_draft", mode],
        capture_output=True,
        stdin=subprocess.DEVNULL,
        text=True,
        env=env,
        timeout=timeout,
        cwd=Path(__file__).parents[1],
    )
    # (transformers' remote-code prompt may precede the line without a newline)
    lines = [line[line.index('{"ok"') :] for line in proc.stdout.splitlines() if '{"ok"' in line]
    if not lines:
        raise AssertionError(
            f"no result line ({proc.returncode}):\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
        )
    return json.loads(lines[-1])
