"""hidden_states_capture: speculators' forward replacement on DeepSeek-V3."""

from __future__ import annotations

import re

from speculators_compat.shims.hidden_states_capture import SHIM
from tests.helpers import needs_claim, run_generator


def test_without_it_deepseek_is_refused_by_the_eagle3_gate(claimed):
    needs_claim(claimed, SHIM)
    result = run_generator("deepseek-v3-tiny", 2, disable=SHIM.name)
    assert not result["ok"]
    # Up to 0.17 the supports_eagle3 gate refuses DeepSeek; vLLM 0.32's DeepSeek declares
    # SupportsEagle3, and speculators' forward then fails on the missing get_input_embeddings.
    # What vLLM said is what the shim's record tells users they will see.
    seen = re.search(
        r"Model DeepseekV3ForCausalLM does not support hidden state extraction"
        r"|'\w+' object has no attribute 'get_input_embeddings'",
        result["message"],
    )
    assert seen, result["message"]
    assert seen.group(0) in SHIM.symptom, (seen.group(0), SHIM.symptom)
