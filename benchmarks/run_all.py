"""Run every benchmark that applies to the installed vLLM and print each one's ratio.

    python benchmarks/run_all.py            # capture overhead, time to a validated patch,
                                            # memory, import cost (and, on vLLM 0.11, the
                                            # comparison with the unpatched original)

``tox -e bench`` runs this on vLLM 0.16; ``tox -e bench-original`` runs the comparison with
the original on vLLM 0.11. Each benchmark is also a script of its own (see --help).
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent


def main() -> int:
    from packaging.version import Version

    from speculators_compat.versions import installed_versions

    runs = [
        ["extraction_speed.py"],
        ["time_to_patch.py"],
        ["memory.py"],
        ["import_cost.py"],
    ]
    if installed_versions().vllm < Version("0.12"):
        runs.insert(1, ["extraction_speed.py", "--against", "original"])
    failed = []
    for run in runs:
        if subprocess.run([sys.executable, str(HERE / run[0]), *run[1:]]).returncode:
            failed.append(" ".join(run))
    if failed:
        print(f"\nfailed: {', '.join(failed)}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
