"""multimodal_text_only: Kimi-K2.5's wrapper, extracted without its vision tower."""

from __future__ import annotations

import pytest

from speculators_compat.oracle.reference import TOLERANCE
from speculators_compat.shims.multimodal_text_only import SHIM
from tests.helpers import run_generator, unsupported_reason


def test_without_it_the_wrapper_wants_vision_weights_and_with_it_states_match():
    reason = unsupported_reason("KimiK25ForConditionalGeneration")
    if reason:
        pytest.skip(reason)
    without = run_generator("kimi-k25-tiny", 2, disable=SHIM.name)
    assert not without["ok"]
    # the worker's own error (worker_start_error): it wants the vision tower's weights
    assert "failed to start" in without["message"], without["message"][:2000]
    assert "vision_tower." in without["message"]
    with_it = run_generator("kimi-k25-tiny", 2)
    assert with_it["ok"] and max(with_it["errors"]) <= TOLERANCE["float32"]
