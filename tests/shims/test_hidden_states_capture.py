"""hidden_states_capture: speculators' forward replacement on DeepSeek-V3."""

from __future__ import annotations

from speculators_compat.shims.hidden_states_capture import SHIM
from tests.helpers import run_generator
from tests.shims.conftest import needs_claim


def test_without_it_deepseek_is_refused_by_the_eagle3_gate(claimed):
    needs_claim(claimed, SHIM)
    result = run_generator("deepseek-v3-tiny", 2, disable=SHIM.name)
    assert not result["ok"]
    # Up to 0.17 the supports_eagle3 gate refuses DeepSeek; vLLM 0.32's DeepSeek declares
    # SupportsEagle3, and speculators' forward then fails on the missing get_input_embeddings.
    assert (
        "Model DeepseekV3ForCausalLM does not support hidden state extraction" in result["message"]
        or "'DeepseekV2Model' object has no attribute 'get_input_embeddings'" in result["message"]
    ), result["message"]
    assert "get_input_embeddings" in SHIM.symptom
    assert "does not support hidden state extraction" in SHIM.symptom
