"""checkpointer_cpu: training resumes from its checkpoint on CPU."""

from __future__ import annotations

import pytest
import torch

from speculators_compat.shims.checkpointer_cpu import SHIM
from tests.helpers import run_draft

pytestmark = [pytest.mark.training, pytest.mark.skipif(torch.cuda.is_available(), reason="CPU-only shim")]


def test_resume_on_cpu():
    assert run_draft("resume") == {"ok": True, "resumed_at_epoch": 1, "epochs": ["0", "1"]}
    without = run_draft("resume", disable=SHIM.name)
    assert not without["ok"]
    assert "Found no NVIDIA driver" in without["error"]
