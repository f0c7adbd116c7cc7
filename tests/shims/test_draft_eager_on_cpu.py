"""draft_eager_on_cpu: speculators' Trainer takes a step on CPU."""

from __future__ import annotations

import pytest
import torch

from speculators_compat.shims.draft_eager_on_cpu import SHIM
from tests.helpers import run_draft

pytestmark = [pytest.mark.training, pytest.mark.skipif(torch.cuda.is_available(), reason="CPU-only shim")]


def test_training_step_on_cpu():
    assert run_draft("step") == {"ok": True}
    without = run_draft("step", disable=SHIM.name)
    assert without["error_type"] == "InductorError"
    assert "IndexError: tuple index out of range" in without["error"]
