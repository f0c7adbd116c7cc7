"""Every shim test gets the shim record and whether this env's vLLM is in its claimed range."""

from __future__ import annotations

import pytest

from speculators_compat.registry import in_range
from speculators_compat.versions import installed_versions


@pytest.fixture
def claimed():
    """claimed(shim) -> True when this env's vLLM lies in the versions the shim names."""

    def check(shim) -> bool:
        return in_range(installed_versions().vllm, shim.vllm)

    return check
