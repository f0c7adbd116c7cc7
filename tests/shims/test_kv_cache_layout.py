"""kv_cache_layout: the KV-cache layout the engine core would resolve, for speculators' executor."""

from __future__ import annotations

import pytest

from speculators_compat.oracle.reference import TOLERANCE
from speculators_compat.shims.kv_cache_layout import SHIM, probe
from tests.helpers import needs_claim, run_generator


def test_without_it_the_layout_is_never_resolved(claimed):
    needs_claim(claimed, SHIM)
    if not probe():
        pytest.skip("this vLLM sizes the KV cache without a resolved layout (the probe finds no drift)")
    result = run_generator("llama-tiny", 3, disable=SHIM.name)
    assert not result["ok"], result
    assert "KV cache layout has not been resolved yet" in result["message"]
    fixed = run_generator("llama-tiny", 3)
    assert fixed["ok"] and fixed["status"][SHIM.name] == "applied", fixed
    assert max(fixed["errors"]) <= TOLERANCE["float32"]
