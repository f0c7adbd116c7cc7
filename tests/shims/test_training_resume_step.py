"""training_resume_step: a resumed run logs its metrics at the steps the uninterrupted run logs."""

from __future__ import annotations

import pytest

from speculators_compat.shims.training_resume_step import SHIM
from tests.helpers import run_draft

pytestmark = pytest.mark.training


def test_a_resumed_epoch_logs_at_the_uninterrupted_runs_steps():
    result = run_draft("resume_lr")
    assert result["ok"] and result["resumed_at_epoch"] == 1, result
    steps = result["uninterrupted_steps"]
    assert len(steps) >= 2 and steps[0] > 0, result  # the second epoch of the whole run
    assert result["resumed_steps"] == steps

    without = run_draft("resume_lr", disable=SHIM.name)
    assert without["ok"], without
    # the symptom: the resumed epoch counts from 0 again
    first_epoch = steps[0]
    assert without["resumed_steps"] == [s - first_epoch for s in steps], without
