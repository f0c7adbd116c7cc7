"""Fresh Python processes for the tests, forked from a parent that has already imported torch,
transformers, vLLM and (where it can be imported first) speculators, and activated nothing.

Almost every ablation test runs its case in a fresh interpreter, so that the shims it disables
stay disabled and nothing one test patches reaches another. Importing torch, vLLM, transformers
and speculators costs such an interpreter about 5 s on a 2-core machine before it does anything.
This server pays that once per test session; each request forks it. The child keeps what a fresh
interpreter guarantees and what the tests rely on:

- it has never imported ``speculators_compat`` (the server refuses to start if a preloaded module
  pulled it in), so ``import speculators_compat`` activates the shims in the child, reading the
  child's own ``SPECULATORS_COMPAT_*`` settings; hooked modules already imported are patched at
  once, as when a user imports vLLM before ``speculators_compat``;
- its environment, arguments, working directory, stdin, stdout and stderr are the request's
  (``os.environ`` replaced before anything runs; vLLM reads its settings lazily);
- it runs in a session of its own, its ``__main__`` is new, and it exits as an interpreter does
  (non-daemon threads joined, ``atexit`` handlers run).

What it cannot give: settings read while the preloaded modules were imported (torch's, the
Hugging Face cache paths) are the session's, and every child has the server's string-hash seed
(a fresh interpreter draws its own), so a test that depends on those must start a real process
(``fresh(..., fork=False)``). ``SPECULATORS_COMPAT_TEST_FORK=0`` turns the server off.

A child's ``spawn`` processes (vLLM's CPU workers) start from a fork of the child as it was before
its request ran (``_serve_spawns``), not from a new interpreter.

    python -m tests.forkserver SOCKET   # started by tests.helpers.fresh(); not by hand
"""

from __future__ import annotations

import atexit
import contextlib
import importlib
import json
import os
import runpy
import select
import signal
import socket
import struct
import sys
import threading
import traceback
import types

#: Imported before the first fork, in this order; a module that cannot be imported is skipped.
PRELOAD = (
    "torch",
    "transformers",
    "vllm",
    "vllm.entrypoints.llm",
    "vllm.v1.executor.multiproc_executor",
    "vllm.v1.worker.cpu_worker",
    "vllm.model_executor.models.llama",
    "vllm.model_executor.models.deepseek_v2",
)
#: speculators 0.3.0 under transformers 5 imports only after speculators_compat's
#: config_dtype_annotation shim (docs/shims.md): preloaded where transformers is older.
PRELOAD_SPECULATORS = (
    "speculators",
    "speculators.data_generation.vllm_hidden_states_generator",
    "speculators.models.eagle3",
    "speculators.train.trainer",
)
HEADER = struct.Struct("!I")
#: "0" in a request's environment: its spawned processes are real interpreters (_serve_spawns).
SPAWN_ENV = "SPECULATORS_COMPAT_TEST_SPAWN"
#: The key of a spawn's preparation data that carries its parent's environment.
ENVIRON = "speculators_compat_tests_environ"
#: The helper speaks Python's fork-server protocol as the suite's Pythons (3.10-3.12) have it;
#: later ones change it (3.14 authenticates the socket): there the spawns stay real.
SPAWNS_SERVED = sys.version_info < (3, 13)


def _preload() -> list[str]:
    import torch
    import transformers
    from packaging.version import Version

    names = list(PRELOAD)
    if Version(transformers.__version__).major < 5:
        names += PRELOAD_SPECULATORS
    # Started only where CUDA is not usable (tests.helpers asks first). Asking torch for the CUDA
    # device count (vLLM's Triton check does, on import) marks every process forked afterwards as
    # unable to initialize CUDA ("Cannot re-initialize CUDA in forked subprocess"), where a fresh
    # interpreter says why it is not usable ("Found no NVIDIA driver on your system"). While
    # preloading, the count is the answer already known, 0, without asking; then torch's own.
    ask = torch._C._cuda_getDeviceCount if hasattr(torch._C, "_cuda_getDeviceCount") else None
    if ask is not None:
        torch._C._cuda_getDeviceCount = lambda: 0
    loaded = []
    try:
        for name in names:
            try:
                importlib.import_module(name)
                loaded.append(name)
            except Exception:  # noqa: BLE001 (an optional module of this release; the child imports it)
                pass
    finally:
        if ask is not None:
            torch._C._cuda_getDeviceCount = ask
    if torch.cuda._initialized or _forked_child_cannot_use_cuda():
        raise SystemExit("forkserver: preloading touched CUDA; children would not be fresh")
    leaked = sorted(m for m in sys.modules if m.split(".")[0] == "speculators_compat")
    if leaked:
        raise SystemExit(f"forkserver: preloading imported {leaked}; children would not be fresh")
    return loaded


def _forked_child_cannot_use_cuda() -> bool:
    pid = os.fork()
    if pid == 0:
        os._exit(1 if sys.modules["torch"].cuda._is_in_bad_fork() else 0)
    return os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]) != 0


def _recv_exact(conn: socket.socket, size: int) -> bytes:
    data = b""
    while len(data) < size:
        chunk = conn.recv(size - len(data))
        if not chunk:
            raise ConnectionError("client went away")
        data += chunk
    return data


def _exit_code(exc: SystemExit) -> int:
    if exc.code is None:
        return 0
    if isinstance(exc.code, int):
        return exc.code
    print(exc.code, file=sys.stderr)
    return 1


def _child(request: dict, fds: list[int]) -> None:
    """In the forked child: become the requested process, run it, exit. Never returns."""
    code = 1
    try:
        os.setsid()
        signal.signal(signal.SIGINT, signal.default_int_handler)
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        for target, fd in zip((0, 1, 2), fds, strict=True):
            os.dup2(fd, target)
            os.close(fd)
        os.chdir(request["cwd"])
        os.environ.clear()
        os.environ.update(request["env"])
        unbuffered = bool(os.environ.get("PYTHONUNBUFFERED"))
        sys.stdout.reconfigure(write_through=unbuffered)
        if os.environ.get(SPAWN_ENV, "1") != "0" and SPAWNS_SERVED:
            _serve_spawns()
        main = types.ModuleType("__main__")
        sys.modules["__main__"] = main
        argv = request["argv"]
        if argv[0] == "-c":
            sys.argv = ["-c", *argv[2:]]
            sys.path[0] = ""
            exec(compile(argv[1], "<string>", "exec"), main.__dict__)
        elif argv[0] == "-m":
            sys.argv = [argv[1], *argv[2:]]
            sys.path[0] = os.getcwd()
            runpy._run_module_as_main(argv[1], alter_argv=True)
        else:
            sys.argv = list(argv)
            sys.path[0] = os.path.dirname(os.path.abspath(argv[0]))
            runpy.run_path(argv[0], run_name="__main__")
        code = 0
    except SystemExit as exc:
        code = _exit_code(exc)
    except BaseException:  # noqa: BLE001 (what an interpreter prints for an uncaught exception)
        traceback.print_exc()
        code = 1
    finally:
        try:
            threading._shutdown()  # as the interpreter does at exit: join non-daemon threads
            atexit._run_exitfuncs()
            sys.stdout.flush()
            sys.stderr.flush()
        finally:
            os._exit(code)


def _serve_spawns() -> None:
    """Let this child's ``spawn`` processes (vLLM's CPU workers) start from a fork of itself as it
    is now, before its request runs: never having imported ``speculators_compat``, torch and vLLM
    imported, the request's environment.

    vLLM's CPU platform always starts its workers with ``spawn``; each re-imports torch and vLLM
    (5-6 s on one CPU) before it builds a model. Here a helper forked now runs Python's own fork
    server (``multiprocessing.forkserver.main``), and this child's ``spawn`` processes go through
    it as ``forkserver`` processes do: the worker prepares as a spawned one does (``sys.path``,
    working directory, ``__main__`` imported as ``__mp_main__``, so the shims come from the user's
    import or vLLM's plugin, as in a spawned worker), with the environment the parent has when it
    starts it (vLLM sets the worker's OpenMP settings there), and runs ``atexit`` handlers at exit;
    its pid, exit code and sentinel behave as a spawned process's. Only modules preloaded by this
    server differ from a spawned interpreter's (imported once, before the request's settings).
    ``SPECULATORS_COMPAT_TEST_SPAWN=0`` in a request's environment leaves its spawns real.
    """
    import multiprocessing.context as mp_context
    from multiprocessing import connection, forkserver, spawn

    listener = socket.socket(socket.AF_UNIX)
    address = connection.arbitrary_address("AF_UNIX")
    listener.bind(address)
    os.chmod(address, 0o600)
    listener.listen()
    alive_r, alive_w = os.pipe()
    pid = os.fork()
    if pid == 0:  # the helper: lives until the child exits (its end of the pipe closes)
        code = 0
        try:
            os.close(alive_w)
            _prepare_as_spawned(spawn)
            forkserver.main(listener.fileno(), alive_r, [])
        except SystemExit:
            pass
        except BaseException:  # noqa: BLE001 (the child's spawns then fail and say so)
            traceback.print_exc()
            code = 1
        finally:
            os._exit(code)
    listener.close()
    os.close(alive_r)
    server = forkserver._forkserver
    server._forkserver_address, server._forkserver_alive_fd, server._forkserver_pid = address, alive_w, pid
    get_preparation_data = spawn.get_preparation_data

    def with_environment(name):
        return {**get_preparation_data(name), ENVIRON: dict(os.environ)}

    spawn.get_preparation_data = with_environment
    mp_context.SpawnProcess._Popen = staticmethod(mp_context.ForkServerProcess._Popen)


def _prepare_as_spawned(spawn: types.ModuleType) -> None:
    """In the helper: each forked process takes its parent's environment before it prepares,
    and runs ``atexit`` handlers when its target returns, as a spawned interpreter does."""
    prepare, main = spawn.prepare, spawn._main

    def prepare_with_environment(data):
        environ = data.pop(ENVIRON, None)
        if environ is not None:
            os.environ.clear()
            os.environ.update(environ)
        prepare(data)

    def main_with_exit(fd, parent_sentinel=None):
        code = main(fd, parent_sentinel)
        atexit._run_exitfuncs()
        return code

    spawn.prepare, spawn._main = prepare_with_environment, main_with_exit


def serve(path: str) -> None:
    loaded = _preload()
    parent = os.getppid()
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(path)
    server.listen(64)
    print(json.dumps({"ready": loaded}), flush=True)
    os.dup2(2, 1)  # from now on this process's own output goes to its log, never to the pipe
    waiting: dict[int, socket.socket] = {}
    while True:
        if os.getppid() != parent:  # the test session is gone
            for pid in waiting:
                os.killpg(pid, signal.SIGKILL)
            return
        readable, _, _ = select.select([server], [], [], 0.05)
        if readable:
            conn, _ = server.accept()
            header, fds, _, _ = socket.recv_fds(conn, HEADER.size, 3)
            request = json.loads(_recv_exact(conn, HEADER.unpack(header)[0]))
            pid = os.fork()
            if pid == 0:
                server.close()
                conn.close()
                _child(request, fds)
            for fd in fds:
                os.close(fd)
            conn.sendall(f"{pid}\n".encode())
            waiting[pid] = conn
        while waiting:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                break
            if pid == 0:
                break
            conn = waiting.pop(pid, None)
            if conn is not None:
                with contextlib.suppress(OSError):  # the client gave up (a timeout)
                    conn.sendall(f"{os.waitstatus_to_exitcode(status)}\n".encode())
                conn.close()


if __name__ == "__main__":
    serve(sys.argv[1])
