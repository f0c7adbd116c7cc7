"""token_attribution: every sequence gets its own states (chunked prefill, > 32 sequences)."""

from __future__ import annotations

from speculators_compat.oracle.reference import TOLERANCE
from speculators_compat.shims.token_attribution import SHIM
from tests.helpers import needs_claim, run_generator


def test_without_it_states_land_on_the_wrong_sequences_and_with_it_they_do_not(claimed):
    needs_claim(claimed, SHIM)
    without = run_generator("llama-tiny", 40, disable=SHIM.name, chunked=True)
    assert without["ok"], without.get("message")  # silently wrong: no error at all
    wrong = [e for e in without["errors"] if isinstance(e, str) or e > 0.5]
    assert len(wrong) >= 10, without["errors"]
    with_it = run_generator("llama-tiny", 40, chunked=True)
    assert with_it["ok"] and max(with_it["errors"]) <= TOLERANCE["float32"]
