"""Write constraints/lock/vllm-X.Y.txt: every package of each tox env, pinned.

Run after the envs exist (e.g. ``tox --notest``); tox.ini passes each lock file to uv with the
hand-written constraints, so a fresh machine resolves exactly these versions.

    python tools/lock_envs.py [TOX_WORK_DIR]
"""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _releases():
    """speculators_compat/releases.py, loaded by path (this tool runs without the package)."""
    spec = importlib.util.spec_from_file_location("_releases", ROOT / "speculators_compat" / "releases.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module.RELEASES


VERSIONS = [release.minor for release in _releases()]


def main() -> None:
    work = Path(sys.argv[1]) if len(sys.argv) > 1 else ROOT / ".tox"
    out_dir = ROOT / "constraints" / "lock"
    out_dir.mkdir(exist_ok=True)
    for version in VERSIONS:
        python = work / f"vllm{version}" / "bin" / "python"
        if not python.exists():
            print(f"skip vllm{version}: no env at {python.parent.parent}")
            continue
        freeze = subprocess.run(
            ["uv", "pip", "freeze", "--python", str(python)], check=True, capture_output=True, text=True
        ).stdout.splitlines()
        pins = sorted(
            (line for line in freeze if "==" in line and not line.startswith("speculators-compat")),
            key=str.lower,
        )
        header = f"# Every package of the vllm{version} tox env, pinned (tools/lock_envs.py).\n"
        (out_dir / f"vllm-{version}.txt").write_text(header + "\n".join(pins) + "\n")
        print(f"vllm{version}: {len(pins)} pins")


if __name__ == "__main__":
    main()
