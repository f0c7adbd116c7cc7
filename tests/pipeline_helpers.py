"""Running the CLI in a fresh process, as a user does."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).parents[1]


def cli(*args, env: dict[str, str] | None = None, timeout: float = 900) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "speculators_compat", *map(str, args)],
        capture_output=True,
        text=True,
        env={**os.environ, **(env or {})},
        timeout=timeout,
        cwd=ROOT,
    )


def prepare(model, out, *args, data=None) -> subprocess.CompletedProcess:
    """``speculators-compat prepare`` of ``model`` on the embedded chat data (or ``data``)."""
    from speculators_compat.tiny import chat_dataset_path

    return cli("prepare", "--model", model, "--data", data or chat_dataset_path(), "--out", out, *args)
