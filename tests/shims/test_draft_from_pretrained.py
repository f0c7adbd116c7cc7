"""draft_from_pretrained: a draft saved by speculators' checkpointer loads with its from_pretrained."""

from __future__ import annotations

import pytest

from speculators_compat.shims.draft_from_pretrained import SHIM
from tests.helpers import run_draft

pytestmark = pytest.mark.training


def test_saved_draft_loads():
    with_it = run_draft("load")
    assert with_it["ok"], with_it
    assert with_it["max_weight_difference"] == 0.0
    without = run_draft("load", disable=SHIM.name)
    assert not without["ok"]
    assert "unexpected keyword argument 'verifier'" in without["error"]
