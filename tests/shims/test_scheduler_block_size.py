"""scheduler_block_size: Scheduler(...) built as speculators 0.3.0 builds it."""

from __future__ import annotations

import pytest

from speculators_compat.shims._targets import GENERATOR, module
from speculators_compat.shims.scheduler_block_size import SHIM
from tests.helpers import needs_claim


def test_unpatched_fails_with_the_symptom(claimed, state):
    """The patched call builds a real Scheduler in the end-to-end test (tests/test_generator.py)."""
    needs_claim(claimed, SHIM)
    assert state(SHIM) == "applied"
    patched = module(GENERATOR).Scheduler
    with pytest.raises(TypeError, match="missing 1 required positional argument: 'block_size'"):
        patched.__wrapped__(vllm_config=None, kv_cache_config=None, structured_output_manager=None)
