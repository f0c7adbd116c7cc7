"""draft_verifier_wrapper: the draft on Kimi-K2.5's wrapper takes the wrapped text model's weights."""

from __future__ import annotations

import pytest

from speculators_compat.shims.draft_verifier_wrapper import SHIM
from tests.helpers import run_draft

pytestmark = pytest.mark.training


def test_draft_on_a_wrapped_verifier():
    with_it = run_draft("kimi")
    assert with_it == {"ok": True, "embed_equal": True, "head_equal": True}
    without = run_draft("kimi", disable=SHIM.name)
    assert not without["ok"]
    assert "contains custom code which must be executed" in without["error"]
