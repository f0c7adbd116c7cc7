"""collective_rpc_unique_reply: speculators' captured_states_list[0] on vLLM >= 0.12."""

from __future__ import annotations

from speculators_compat.shims.collective_rpc_unique_reply import SHIM
from tests.helpers import needs_claim, run_generator


def test_without_it_speculators_takes_the_first_layer_for_the_list(claimed):
    needs_claim(claimed, SHIM)
    result = run_generator("llama-tiny", 4, disable=f"token_attribution,{SHIM.name}")
    assert not result["ok"]
    assert "Boolean value of Tensor with more than one value is ambiguous" in result["message"]
    assert result["message"] in SHIM.symptom


def test_with_it_speculators_own_generate_gets_the_list_of_layers(claimed):
    needs_claim(claimed, SHIM)
    # One short sequence: speculators 0.3.0's offset slicing is right for that case.
    result = run_generator("llama-tiny", 1, disable="token_attribution")
    assert result["ok"], result.get("message")
    assert result["errors"][0] < 5e-3
