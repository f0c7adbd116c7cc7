"""training_resume_lr: a resumed run trains its first step at the rate where the schedule stood."""

from __future__ import annotations

import pytest

from speculators_compat.shims.training_resume_lr import SHIM
from tests.helpers import run_draft

pytestmark = pytest.mark.training


def test_a_resumed_epoch_has_the_uninterrupted_runs_learning_rates():
    result = run_draft("resume_lr")
    assert result["ok"] and result["resumed_at_epoch"] == 1, result
    assert len(result["uninterrupted"]) >= 2
    assert result["resumed"] == pytest.approx(result["uninterrupted"], rel=1e-12)

    without = run_draft("resume_lr", disable=SHIM.name)
    assert without["ok"], without
    first, *rest = without["resumed"]
    # the symptom: the first step at the schedule's rate for step 1; the rest as they should be
    assert first != pytest.approx(without["uninterrupted"][0], rel=1e-3), without
    assert rest == pytest.approx(without["uninterrupted"][1:], rel=1e-12)
