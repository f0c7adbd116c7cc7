"""Write-then-rename: a reader (or a resumed run) never sees a half-written file."""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Callable
from pathlib import Path

#: Suffix of files being written. It does not end in "pt", so speculators' data loader (which
#: reads every file ending in "pt") never picks one up.
PARTIAL = ".partial"


def write_file(path: Path, write: Callable[[Path], None]) -> Path:
    """Call ``write(tmp)`` and move ``tmp`` onto ``path`` in one rename."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f"{path.name}.{os.getpid()}{PARTIAL}")
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
    tmp = path.with_name(f"{path.name}.{os.getpid()}{PARTIAL}")
    shutil.rmtree(tmp, ignore_errors=True)
    try:
        write(tmp)
        if path.exists():
            shutil.rmtree(path)
        os.replace(tmp, path)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return path


def remove_partials(folder: Path) -> int:
    """Delete leftovers of interrupted writes; returns how many."""
    if not folder.is_dir():
        return 0
    leftovers = list(folder.glob(f"*{PARTIAL}"))
    for p in leftovers:
        shutil.rmtree(p) if p.is_dir() else p.unlink(missing_ok=True)
    return len(leftovers)
