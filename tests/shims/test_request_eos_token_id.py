"""request_eos_token_id: Request(...) built as speculators 0.3.0 builds it."""

from __future__ import annotations

import pytest

from speculators_compat.shims._targets import GENERATOR, module
from speculators_compat.shims.request_eos_token_id import SHIM
from tests.helpers import needs_claim


def _call():
    from vllm import SamplingParams

    return dict(
        request_id="req_0_0",
        prompt_token_ids=[1, 2, 3],
        sampling_params=SamplingParams(max_tokens=1, temperature=0.0),
        pooling_params=None,
        eos_token_id=7,
        arrival_time=0.0,
    )


def test_unpatched_fails_with_the_symptom_and_patched_keeps_the_eos(claimed, state):
    needs_claim(claimed, SHIM)
    assert state(SHIM) == "applied"
    patched = module(GENERATOR).Request
    with pytest.raises(TypeError, match="unexpected keyword argument 'eos_token_id'"):
        patched.__wrapped__(**_call())
    request = patched(**_call())
    assert request.prompt_token_ids == [1, 2, 3]
    assert request.sampling_params.eos_token_id == 7
    assert 7 in request.sampling_params.all_stop_token_ids
