"""Helpers for tests that need a fresh Python process."""

from __future__ import annotations

import atexit
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

ROOT = Path(__file__).parents[1]
#: ``0``: every fresh process is a new interpreter (no fork server).
FORK_ENV = "SPECULATORS_COMPAT_TEST_FORK"
_server: dict = {}


def _forkserver_socket() -> str | None:
    """The session's fork server (tests/forkserver.py), started on first use; None if it is off."""
    import torch

    if os.environ.get(FORK_ENV, "1") == "0" or torch.cuda.is_available():
        return None  # (a child forked after CUDA was asked for could not use it)
    if "path" not in _server:
        folder = tempfile.mkdtemp(prefix="speculators-compat-forkserver-")
        path = os.path.join(folder, "socket")
        log_path = os.path.join(folder, "log")
        with open(log_path, "w") as log:
            proc = subprocess.Popen(
                [sys.executable, "-m", "tests.forkserver", path],
                cwd=ROOT,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=log,
                text=True,
                start_new_session=True,
            )
        # (what preloading vLLM logs comes first: vLLM's logger writes to stdout)
        line = proc.stdout.readline()
        while line and not line.startswith('{"ready"'):
            line = proc.stdout.readline()
        if not line:
            proc.wait()
            raise RuntimeError(f"the tests' fork server did not start:\n{Path(log_path).read_text()[-4000:]}")
        atexit.register(proc.kill)
        _server.update(path=path, proc=proc)
    return _server["path"]


def _readline(conn: socket.socket) -> str:
    """One line (the server's pid line and exit-status line can arrive together: byte by byte)."""
    data = b""
    while not data.endswith(b"\n"):
        chunk = conn.recv(1)
        if not chunk:
            raise RuntimeError("the tests' fork server went away")
        data += chunk
    return data.decode()


def fresh(
    args: list[str],
    env: dict[str, str] | None = None,
    cwd: str | os.PathLike | None = None,
    timeout: float | None = None,
    fork: bool = True,
) -> subprocess.CompletedProcess:
    """``python ARGS`` as a fresh process (stdin empty, output captured as text), like
    ``subprocess.run``; forked from the session's fork server (tests/forkserver.py says what a
    child keeps of a fresh interpreter) unless ``fork`` is False or $SPECULATORS_COMPAT_TEST_FORK
    is 0. ``env`` is the whole environment (default: this process's)."""
    env = dict(os.environ if env is None else env)
    cwd = str(cwd or os.getcwd())
    path = _forkserver_socket() if fork else None
    if path is None:
        return subprocess.run(
            [sys.executable, *args], capture_output=True, text=True, env=env, cwd=cwd,
            timeout=timeout, stdin=subprocess.DEVNULL,
        )  # fmt: skip
    from tests.forkserver import HEADER

    with (
        tempfile.TemporaryFile("w+") as out,
        tempfile.TemporaryFile("w+") as err,
        open(os.devnull) as devnull,
        socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as conn,
    ):
        conn.connect(path)
        body = json.dumps({"argv": list(map(str, args)), "env": env, "cwd": cwd}).encode()
        socket.send_fds(conn, [HEADER.pack(len(body))], [devnull.fileno(), out.fileno(), err.fileno()])
        conn.sendall(body)
        pid = int(_readline(conn))
        conn.settimeout(timeout)
        try:
            returncode = int(_readline(conn))
        except TimeoutError:
            os.killpg(pid, signal.SIGKILL)
            conn.settimeout(None)
            _readline(conn)
            out.seek(0)
            err.seek(0)
            raise subprocess.TimeoutExpired(args, timeout, out.read(), err.read()) from None
        out.seek(0)
        err.seek(0)
        return subprocess.CompletedProcess([sys.executable, *args], returncode, out.read(), err.read())


def run_python(code: str, env: dict[str, str | None] | None = None, timeout: float = 600) -> dict:
    """Run ``code`` in a fresh interpreter; it must print one JSON line last. Returns that.
    ``env`` adds to this process's environment; a value of None removes the variable.

    The child's stdout is a pipe, so block-buffered: a child that ends with ``os._exit`` must
    print its line with ``flush=True`` (``PYTHONUNBUFFERED`` in a developer's shell hides this).
    """
    full_env = {k: v for k, v in {**os.environ, **(env or {})}.items() if v is not None}
    proc = fresh(["-c", textwrap.dedent(code)], env=full_env, timeout=timeout)
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
    args = ["-m", "tests.shims.run_generator", model, str(count)]
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
    proc = fresh(args, env=env, timeout=timeout, cwd=ROOT)
    lines = [line for line in proc.stdout.splitlines() if line.startswith('{"ok"')]
    if not lines:
        raise AssertionError(
            f"no result line ({proc.returncode}):\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
        )
    # what vLLM's workers logged (their errors go to stdout), for a symptom that only they print
    return {**json.loads(lines[-1]), "output": proc.stdout[-20000:]}


def run_draft(mode: str, disable: str = "", timeout: float = 600) -> dict:
    """tests/shims/run_draft.py MODE in a fresh process, with ``disable``d shims."""
    env = {**os.environ, "SPECULATORS_COMPAT_DISABLE": disable}
    proc = fresh(["-m", "tests.shims.run_draft", mode], env=env, timeout=timeout, cwd=ROOT)
    # (transformers' remote-code prompt may precede the line without a newline)
    lines = [line[line.index('{"ok"') :] for line in proc.stdout.splitlines() if '{"ok"' in line]
    if not lines:
        raise AssertionError(
            f"no result line ({proc.returncode}):\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
        )
    return json.loads(lines[-1])


def needs_claim(claimed, shim):
    """Skip unless this env's vLLM (and transformers) lie in ``shim``'s range (``claimed``: the
    fixture of tests/shims/conftest.py)."""
    import pytest

    from speculators_compat.versions import installed_versions

    if not claimed(shim):
        v = installed_versions()
        pytest.skip(
            f"vLLM {v.vllm} / transformers {v.transformers} is outside {shim.name}'s range "
            f"{shim.vllm} / {shim.transformers or 'any'}"
        )


def runs_mla(recipe: str) -> bool:
    """An ``-mla`` recipe (``deepseek-v3-tiny-mla``, ``deepseek-v3-tiny-mla-sharp``) exists to run
    MLA, where the CPU build has it; the others run MLA off."""
    return "mla" in recipe.split("-")


def mla_skip_reason(recipe: str) -> str | None:
    """An ``-mla`` recipe exists to run MLA: why this vLLM cannot (its other recipes run MLA off)."""
    if not runs_mla(recipe):
        return None
    from speculators_compat import cpu_mla
    from speculators_compat.tiny import build

    choice = cpu_mla.choose(build(recipe))
    return None if choice is None or choice.use_mla else choice.reason


def assert_mla_as_chosen(vllm_config, recipe: str) -> None:
    """The engine runs MLA exactly for the ``-mla`` recipes (where the build has it), through the
    CPU backend that takes every dtype."""
    from speculators_compat import cpu_mla

    if "deepseek" in recipe or "kimi" in recipe:
        use_mla = vllm_config.model_config.use_mla
        assert use_mla == runs_mla(recipe), f"{recipe}: use_mla is {use_mla}"
        if use_mla:
            assert vllm_config.attention_config.backend.name == cpu_mla.BACKEND


def unsupported_reason(architecture: str) -> str | None:
    """Why this vLLM cannot build ``architecture`` on the CPU backend, or None if it can."""
    import inspect

    import torch
    from vllm import ModelRegistry

    from speculators_compat.versions import installed_versions

    version = installed_versions().vllm
    if architecture not in ModelRegistry.get_supported_archs():
        return f"vLLM {version} has no {architecture} in its model registry"
    if architecture == "KimiK25ForConditionalGeneration" and not torch.cuda.is_available():
        from vllm.model_executor.models import kimi_k25

        init = inspect.getsource(kimi_k25.KimiK25ForConditionalGeneration.__init__)
        if "torch.cuda.current_device()" in init:
            return (
                f"vLLM {version}'s KimiK25ForConditionalGeneration.__init__ calls "
                "torch.cuda.current_device(): it cannot be built on the CPU backend "
                "(RuntimeError: Found no NVIDIA driver on your system)"
            )
    return None
