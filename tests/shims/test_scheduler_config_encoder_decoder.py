"""scheduler_config_encoder_decoder: SchedulerConfig built as speculators 0.3.0 builds it."""

from __future__ import annotations

import pytest

from speculators_compat.shims._targets import GENERATOR, module
from speculators_compat.shims.scheduler_config_encoder_decoder import SHIM
from tests.helpers import needs_claim

KWARGS = dict(max_num_seqs=32, max_model_len=2048, max_num_batched_tokens=8192)


def test_unpatched_fails_with_the_symptom_and_patched_builds(claimed, state):
    needs_claim(claimed, SHIM)
    assert state(SHIM) == "applied"
    patched = module(GENERATOR).SchedulerConfig
    with pytest.raises(Exception, match="is_encoder_decoder") as info:
        patched.__wrapped__(**KWARGS)
    assert "Field required" in str(info.value)
    config = patched(**KWARGS)
    assert config.max_num_seqs == 32 and config.max_num_batched_tokens == 8192
