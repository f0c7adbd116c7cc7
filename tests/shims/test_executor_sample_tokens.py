"""executor_sample_tokens: speculators' execute_model loop on vLLM >= 0.12."""

from __future__ import annotations

import re

from speculators_compat.shims.executor_sample_tokens import SHIM
from tests.helpers import needs_claim, run_generator


def test_without_it_speculators_loop_hits_the_worker_state_error(claimed):
    needs_claim(claimed, SHIM)
    # token_attribution off too: speculators 0.3.0's own generate() loop, as users run it, over
    # more tokens than one step takes (the second execute_model is the one that fails)
    result = run_generator("llama-tiny", 40, disable=f"token_attribution,{SHIM.name}", chunked=True)
    assert not result["ok"]
    # the worker's error (vLLM's words; worker_error_details adds its type) is what the shim's
    # record tells users they will see
    seen = re.search(r"State error: [^'\n]*", result["message"])
    assert seen, result["message"]
    assert "sample_tokens() must be called after execute_model() returns None" in seen.group(0), result
    assert seen.group(0) in SHIM.symptom, (seen.group(0), SHIM.symptom)
