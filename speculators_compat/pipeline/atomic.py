"""Write-then-rename: a reader (or a resumed run) never sees a half-written file."""

from __future__ import annotations

import json
import os
import shutil
import socket
from collections.abc import Callable
from pathlib import Path

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
