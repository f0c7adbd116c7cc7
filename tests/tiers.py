"""What pytest runs in a tox env, derived from :mod:`speculators_compat.releases`.

    python -m tests.tiers ci  [pytest args]   # the release's CI tier (tox's ci-vllmX.Y envs)
    python -m tests.tiers all [pytest args]   # the whole suite (tox's vllmX.Y envs), on a
                                              # pytest-xdist worker per CPU (parallel_args)
    python -m tests.tiers ci --print          # print the pytest command instead of running it

The release is the installed vLLM's. The tiers are described in ``releases.CI_TIERS``; a shim's
symptom test runs in the CI tier of the oldest release in the shim's range that CI does not run
whole, and again on the newest release that starts an engine, so every shim is proven in every
CI run.
"""

from __future__ import annotations

import os
import sys

from speculators_compat.releases import RELEASES, Release, by_minor, pins, suite_release

API = (
    "tests/test_doctor.py",
    "tests/shims/test_claims.py",
    "tests/test_versions.py",
    "tests/test_releases.py",
    "tests/test_drift_map.py",
)
#: One real engine through speculators' own generator, states against the transformers oracle,
#: on DeepSeek-V3 weights whose attention depends on positions (float32 bound for sharp weights).
ORACLE = (
    "tests/test_generator.py::test_states_match_the_oracle_with_chunked_prefill_and_more_than_"
    "32_sequences[deepseek-v3-tiny-sharp]",
)
CORE = ("tests/test_engine.py", "tests/test_generator.py", "tests/test_capture.py")
SERVING = ("tests/test_serving.py",)
#: Markers of tests that start no engine: run in the matrix only by releases with ``training``.
NO_ENGINE = "not training and not cli_input"


def installed_release() -> Release:
    from packaging.version import Version

    from speculators_compat.versions import installed_versions

    version = installed_versions().vllm
    if version is None:
        raise SystemExit("tests.tiers: vLLM is not installed in this environment")
    release = by_minor(".".join(str(part) for part in Version(str(version)).release[:2]))
    if release is None:
        raise SystemExit(f"tests.tiers: vLLM {version} is not in speculators_compat/releases.py")
    return release


def transformers_of(release: Release) -> str:
    """The transformers version a release's env installs."""
    version = pins(release.minor).get("transformers")
    if version is None:
        raise SystemExit(f"tests.tiers: no transformers pin for vLLM {release.minor} in constraints/")
    return version


def _shims_in(release: Release) -> dict[str, object]:
    """The shims whose vLLM range (and transformers range, where they name one) holds the release."""
    from speculators_compat.shims import SHIMS
    from speculators_compat.versions import in_range

    transformers = transformers_of(release)
    return {
        shim.name: shim
        for shim in SHIMS
        if in_range(f"{release.minor}.0", shim.vllm)
        and (shim.transformers is None or in_range(transformers, shim.transformers))
    }


def shim_tests(release: Release) -> list[str]:
    """Symptom tests of the shims that apply on ``release`` but not on the suite release, each at
    the oldest CI release that has it; the newest release that starts an engine also runs the
    tests of every vLLM-CPU-build shim in its range (the CPU platform is what drifts most)."""
    whole = _shims_in(suite_release())
    here = _shims_in(release)
    chosen = set(here) - set(whole)
    newest_engine = max((r for r in RELEASES if r.cpu_build), key=lambda r: r.key)
    if release == newest_engine:
        chosen |= {name for name, shim in here.items() if shim.platform == "vllm-cpu"}
    else:
        for earlier in (r for r in RELEASES if r.key < release.key and r.ci != "suite"):
            chosen -= set(_shims_in(earlier))
    return [f"tests/shims/test_{name}.py" for name in sorted(chosen)]


def ci_paths(release: Release) -> list[str]:
    paths = list(API)
    if release.ci in ("oracle", "serving"):
        paths += ORACLE
    if release.ci == "serving":
        paths += SERVING
    if release.ci == "core":
        paths += CORE
    return paths + shim_tests(release)


def pytest_args(mode: str, release: Release) -> list[str]:
    if release.ci == "suite" or (mode == "all" and release.cpu_build):
        return [] if release.training else ["-m", NO_ENGINE]
    return ci_paths(release)


def workers() -> int:
    """pytest-xdist workers: one per CPU this process may use, at most one per 6 GiB of memory
    (a worker may hold a vLLM engine, its forkserver and a fresh interpreter), at most 4;
    ``SPECULATORS_COMPAT_TEST_WORKERS`` overrides. ``tests/conftest.py`` pins each to its CPUs."""
    if os.environ.get("SPECULATORS_COMPAT_TEST_WORKERS"):
        return max(1, int(os.environ["SPECULATORS_COMPAT_TEST_WORKERS"]))
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else 1
    memory_gib = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    return max(1, min(cpus, int(memory_gib // 6), 4))


def parallel_args(rest: list[str]) -> list[str]:
    """``-n N --dist loadfile`` (a file's tests, and its module-scoped engines, stay on one
    worker), unless the command line already chooses (``-n``, ``-p no:xdist``)."""
    chosen = any(arg.startswith(("-n", "--numprocesses", "--dist")) or arg == "no:xdist" for arg in rest)
    count = workers()
    return [] if chosen or count < 2 else ["-n", str(count), "--dist", "loadfile"]


def main(argv: list[str]) -> None:
    if not argv or argv[0] not in ("ci", "all"):
        raise SystemExit(__doc__)
    mode, rest = argv[0], argv[1:]
    show = "--print" in rest
    rest = [arg for arg in rest if arg != "--print"]
    release = installed_release()
    # The whole suite on xdist's workers; a CI tier in one process: a tier is a few files, one
    # of which takes most of the time (the serving tier took 8.4 min on 2 workers, its serving
    # file alone on one worker's CPU, against 6.9 in one process on both CPUs; 2026-12-06).
    parallel = parallel_args(rest) if mode == "all" else []
    command = [sys.executable, "-m", "pytest", *pytest_args(mode, release), *parallel, *rest]
    print(f"tests.tiers: vLLM {release.minor}, {mode}: {' '.join(command[2:])}", flush=True)
    if not show:
        os.execv(sys.executable, command)


if __name__ == "__main__":
    main(sys.argv[1:])
