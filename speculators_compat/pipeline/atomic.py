"""Write-then-rename: a reader (or a resumed run) never sees a half-written file; a write that
runs out of disk space leaves nothing partial and says so (:class:`DiskFull`)."""

from __future__ import annotations

import errno
import json
import os
import shutil
import socket
from collections.abc import Callable
from pathlib import Path

from .errors import PipelineError

#: Below this much free space, a failed write is taken for a full disk whatever its error says
#: (torch's zip writer reports a short write as ``RuntimeError: [enforce fail at
#: inline_container.cc:...] . unexpected pos N vs M``, without an errno).
NEARLY_FULL = 16 * 2**20


class DiskFull(PipelineError):
    """A write ran out of space; nothing partial was kept."""

    def __init__(self, path: Path, exc: BaseException):
        self.path = path
        free = free_bytes(path.parent)
        super().__init__(
            f"the disk holding {path.parent} is full ({gib(free)} free) writing {path.name} "
            f"({type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}); nothing "
            "partial was kept. Free space (or move the run folder), then run the same command "
            "again: it continues from what is on disk."
        )


def free_bytes(folder: Path) -> int:
    while not folder.exists() and folder != folder.parent:
        folder = folder.parent
    return shutil.disk_usage(folder).free


def gib(n: float) -> str:
    return f"{n / 2**30:.2f} GiB" if n >= 2**28 else f"{n / 2**20:.1f} MiB"


def disk_full(exc: BaseException, folder: Path) -> bool:
    """``exc`` (or what caused it) is out of space: ENOSPC/EDQUOT, or any write error while the
    disk is nearly full."""
    seen = exc
    while seen is not None:
        if isinstance(seen, OSError) and seen.errno in (errno.ENOSPC, errno.EDQUOT):
            return True
        seen = seen.__cause__ or seen.__context__
    try:
        return isinstance(exc, (OSError, RuntimeError)) and free_bytes(folder) < NEARLY_FULL
    except OSError:
        return False


#: Suffix of files being written. It does not end in "pt", so speculators' data loader (which
#: reads every file ending in "pt") never picks one up.
PARTIAL = ".partial"


def _tmp(path: Path) -> Path:
    """This process's temporary name for ``path``: host and pid, so that processes on several
    machines sharing one folder (``extract --shard``) never write the same temporary file."""
    host = socket.gethostname().replace(".", "-")
    return path.with_name(f"{path.name}.{host}.{os.getpid()}{PARTIAL}")


def write_file(path: Path, write: Callable[[Path], None]) -> Path:
    """Call ``write(tmp)`` and move ``tmp`` onto ``path`` in one rename."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = _tmp(path)
    try:
        write(tmp)
        os.replace(tmp, path)
    except (OSError, RuntimeError) as exc:
        tmp.unlink(missing_ok=True)  # first: the space it took is what the check below reads
        if disk_full(exc, path.parent):
            raise DiskFull(path, exc) from exc
        raise
    finally:
        tmp.unlink(missing_ok=True)
    return path


def write_json(path: Path, data) -> Path:
    return write_file(path, lambda tmp: tmp.write_text(json.dumps(data, indent=2, sort_keys=False) + "\n"))


def write_dir(path: Path, write: Callable[[Path], None]) -> Path:
    """Like :func:`write_file` for a folder (e.g. a saved ``datasets`` dataset)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = _tmp(path)
    shutil.rmtree(tmp, ignore_errors=True)
    try:
        write(tmp)
        if path.exists():
            shutil.rmtree(path)
        os.replace(tmp, path)
    except (OSError, RuntimeError) as exc:
        shutil.rmtree(tmp, ignore_errors=True)
        if disk_full(exc, path.parent):
            raise DiskFull(path, exc) from exc
        raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return path


def partial_target(path: Path) -> str | None:
    """The name of the file that the temporary file ``path`` was to become (None: not one)."""
    if not path.name.endswith(PARTIAL):
        return None
    return path.name[: -len(PARTIAL)].rsplit(".", 2)[0]


def remove_partials(folder: Path, mine: Callable[[str], bool] = lambda _name: True) -> int:
    """Delete leftovers of interrupted writes of the files whose name ``mine`` accepts (a file
    being written by another process, e.g. another shard's, is someone else's); returns how
    many were deleted."""
    if not folder.is_dir():
        return 0
    leftovers = [p for p in folder.glob(f"*{PARTIAL}") if mine(partial_target(p) or "")]
    for p in leftovers:
        shutil.rmtree(p) if p.is_dir() else p.unlink(missing_ok=True)
    return len(leftovers)
