"""How long validating a patch takes: one shim's test file, the whole suite, `tox`.

Each is timed as a user runs it, in this env (a tox env's Python), on this machine:

- a fresh interpreter importing torch, vLLM, transformers and speculators (what every isolated
  test, CLI test and vLLM worker pays), with the installed bytecode and with it ignored (an
  empty ``-X pycache_prefix``, as where nothing was compiled and ``PYTHONDONTWRITEBYTECODE`` is
  set), and the ratio;
- one shim's test file (``pytest FILE``), the median of ``--repeats`` runs;
- an ablation that starts speculators' generator with the shim off and on (``--spawn-test``), the
  median of ``--repeats`` runs, then the same with the tests' spawned processes real
  (``SPECULATORS_COMPAT_TEST_SPAWN=0``: each vLLM CPU worker a new interpreter importing torch and
  vLLM, instead of a fork of the harness's pre-imported child, tests/forkserver.py), and the ratio;
- the whole suite in this env (``--suite``), once as the tox envs run it (``python -m tests.tiers
  all``: one pytest-xdist worker per CPU), with pytest's slowest tests, then once in one process,
  and the ratio;
- the whole suite on the workers with spawns real (``--spawn``), against it with the harness's
  spawns, in one run, and the ratio;
- ``tox`` itself, what CI runs (``--tox``, from the checkout; tox must be on PATH), once.

    python benchmarks/suite_time.py [--shim-test tests/shims/test_scheduler_block_size.py]
                                    [--spawn-test tests/shims/test_token_attribution.py]
                                    [--repeats 3] [--suite] [--spawn] [--tox]
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

from _common import ROOT, header

from tests.forkserver import SPAWN_ENV  # "0": the tests' spawned processes are real interpreters

#: The goals (issue 13), in seconds, for a 2-core machine without a GPU.
GOALS = {"shim test": 15, "suite": 8 * 60, "tox": 30 * 60}
IMPORTS = "import torch, vllm, transformers, speculators.data_generation.vllm_hidden_states_generator"


def run(args: list[str], env: dict[str, str] | None = None) -> tuple[float, str]:
    """Wall seconds and output of ``args``, run from the checkout; a failure stops the benchmark."""
    start = time.perf_counter()
    proc = subprocess.run(args, cwd=ROOT, env=env, capture_output=True, text=True)
    wall = time.perf_counter() - start
    if proc.returncode != 0:
        raise SystemExit(f"{' '.join(args)} failed (exit {proc.returncode}):\n{proc.stdout[-3000:]}")
    return wall, proc.stdout


def timed(args: list[str], env: dict[str, str] | None = None) -> float:
    return run(args, env)[0]


def slowest(output: str, count: int = 15) -> str:
    """The first ``count`` lines of pytest's ``--durations`` report in ``output``."""
    lines = output.splitlines()
    start = next((i for i, text in enumerate(lines) if "slowest" in text and "durations" in text), None)
    return "" if start is None else "\n".join("     " + text for text in lines[start : start + 1 + count])


def import_times(repeats: int) -> tuple[float, float]:
    """Median seconds of a fresh interpreter's imports, with and without bytecode."""
    with_bytecode, without = [], []
    for _ in range(repeats):
        with_bytecode.append(timed([sys.executable, "-W", "ignore", "-c", IMPORTS]))
        with tempfile.TemporaryDirectory() as empty:
            env = {**os.environ, "PYTHONDONTWRITEBYTECODE": "1"}
            without.append(
                timed([sys.executable, "-W", "ignore", "-X", f"pycache_prefix={empty}", "-c", IMPORTS], env)
            )
    return statistics.median(with_bytecode), statistics.median(without)


def pytest_args(*args: str) -> list[str]:
    return [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *args]


def listed(runs: list[float]) -> str:
    return "  (runs: " + ", ".join(f"{r:.1f}" for r in runs) + ")"


def line(what: str, seconds: float, goal: float | None = None, extra: str = "") -> None:
    verdict = "" if goal is None else f"  (goal <= {goal:.0f} s: {'met' if seconds <= goal else 'MISSED'})"
    print(f"   {what:<44} {seconds:8.1f} s{verdict}{extra}", flush=True)


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--shim-test", default="tests/shims/test_scheduler_block_size.py")
    parser.add_argument("--spawn-test", default="tests/shims/test_token_attribution.py")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--suite", action="store_true", help="time the whole suite in this env")
    parser.add_argument(
        "--spawn", action="store_true", help="time the whole suite with real spawns and with the harness's"
    )
    parser.add_argument("--tox", action="store_true", help="time `tox` (what CI runs)")
    args = parser.parse_args()
    header("time to validate a patch", "one shim's test <= 15 s, suite <= 8 min, tox <= 30 min")

    cached, uncached = import_times(args.repeats)
    line("fresh interpreter: import torch+vLLM+...", cached)
    line("  the same, bytecode ignored", uncached, extra=f"  RATIO {cached / uncached:.2f}")

    runs = [timed(pytest_args(args.shim_test)) for _ in range(args.repeats)]
    line(
        f"pytest {args.shim_test}",
        statistics.median(runs),
        GOALS["shim test"],
        extra=listed(runs),
    )

    real = {**os.environ, SPAWN_ENV: "0"}
    ours = [timed(pytest_args(args.spawn_test)) for _ in range(args.repeats)]
    line(
        f"pytest {args.spawn_test}",
        statistics.median(ours),
        extra=listed(ours),
    )
    spawned = [timed(pytest_args(args.spawn_test), real) for _ in range(args.repeats)]
    line(
        "  the same, spawned processes real",
        statistics.median(spawned),
        extra=f"  RATIO {statistics.median(ours) / statistics.median(spawned):.2f}" + listed(spawned),
    )

    # the whole suite as every tox env runs it (one pytest-xdist worker per CPU)
    suite = [sys.executable, "-m", "tests.tiers", "all", "-q", "-p", "no:cacheprovider"]
    if args.spawn:
        ours = timed(suite)
        line("the whole suite (python -m tests.tiers all)", ours, GOALS["suite"])
        spawned = timed(suite, real)
        line("  the same, spawned processes real", spawned, extra=f"  RATIO {ours / spawned:.2f}")
    if args.suite:
        # as the tox envs run it, then in one process
        wall, output = run(suite)
        line("the whole suite (python -m tests.tiers all)", wall, GOALS["suite"])
        print(slowest(output))
        single = timed(pytest_args("-p", "no:xdist"))
        line("  the same in one process (-p no:xdist)", single, extra=f"  RATIO {wall / single:.2f}")
    if args.tox:
        tox = shutil.which("tox")
        if tox is None:
            raise SystemExit("--tox needs tox on PATH (pip install 'tox>=4.20' 'tox-uv>=1.11')")
        line("tox (what CI runs)", timed([tox]), GOALS["tox"])
    return 0


if __name__ == "__main__":
    sys.exit(main())
