"""training_target_final_norm: the draft's targets are the verifier's logits (transformers)."""

from __future__ import annotations

import pytest

from speculators_compat.shims.training_target_final_norm import SHIM
from tests.helpers import run_draft

pytestmark = pytest.mark.training


def test_targets_are_the_verifiers_logits_only_with_the_shim():
    with_it = run_draft("targets")
    without = run_draft("targets", disable=SHIM.name)
    assert with_it["ok"], with_it
    assert without["ok"], without
    assert with_it["error"] <= 1e-5  # measured 0.0 (float32, same ops)
    assert without["error"] > 0.5  # measured 0.96
    assert with_it["extra_saved_keys"] == []  # the checkpoint format is unchanged
