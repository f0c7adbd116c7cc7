"""kv_cache_config_specs: get_kv_cache_config_from_groups called with kv_cache_specs."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from speculators_compat.shims._targets import GENERATOR, module
from speculators_compat.shims.kv_cache_config_specs import SHIM
from tests.helpers import needs_claim

# No KV-cache groups (an attention-free model): every release in the shim's range returns a
# one-block KVCacheConfig, reading at most the cache config's prefix-cache retention (0.32), so
# the call runs through for real.
CALL = dict(
    vllm_config=SimpleNamespace(cache_config=SimpleNamespace(prefix_cache_retention_interval=None)),
    kv_cache_groups=[],
    available_memory=0,
)


def test_unpatched_fails_with_the_symptom_and_patched_runs_the_original(claimed, state):
    needs_claim(claimed, SHIM)
    assert state(SHIM) == "applied"
    patched = module(GENERATOR).get_kv_cache_config_from_groups
    with pytest.raises(TypeError, match="unexpected keyword argument 'kv_cache_specs'"):
        patched.__wrapped__(**CALL, kv_cache_specs={})
    # speculators' call (with kv_cache_specs) returns what vLLM's own function returns without it
    config = patched(**CALL, kv_cache_specs={"layer.0": None})
    assert config == patched.__wrapped__(**CALL)
    assert config.num_blocks == 1 and config.kv_cache_groups == []
