"""Shared fixtures for the per-shim tests."""

from __future__ import annotations

import pytest

import speculators_compat
from speculators_compat.registry import in_range
from speculators_compat.versions import installed_versions


@pytest.fixture
def claimed():
    """claimed(shim) -> True when this env's vLLM lies in the versions the shim names."""

    def check(shim) -> bool:
        v = installed_versions()
        return in_range(v.vllm, shim.vllm) and (
            shim.transformers is None or in_range(v.transformers, shim.transformers)
        )

    return check


@pytest.fixture
def original_code():
    """Every shim undone for the test (probes then read vLLM's and speculators' own code)."""
    speculators_compat.apply_now()
    speculators_compat.unpatch()
    yield
    speculators_compat.apply_now()


@pytest.fixture
def state():
    """state(shim) -> what the registry did with it in this process."""

    def get(shim) -> str:
        return {s.shim.name: s.state for s in speculators_compat.apply_now()}[shim.name]

    return get
