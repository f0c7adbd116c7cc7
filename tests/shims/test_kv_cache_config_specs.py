"""kv_cache_config_specs: get_kv_cache_config_from_groups called with kv_cache_specs."""

from __future__ import annotations

import pytest

from speculators_compat.shims._targets import GENERATOR, module
from speculators_compat.shims.kv_cache_config_specs import SHIM
from tests.shims.conftest import needs_claim

CALL = dict(vllm_config=None, kv_cache_groups=[], kv_cache_specs={}, available_memory=0)


def test_unpatched_fails_with_the_symptom_and_patched_accepts_the_call(claimed, state):
    needs_claim(claimed, SHIM)
    assert state(SHIM) == "applied"
    patched = module(GENERATOR).get_kv_cache_config_from_groups
    with pytest.raises(TypeError, match="unexpected keyword argument 'kv_cache_specs'"):
        patched.__wrapped__(**CALL)
    try:  # the call now binds; it may still fail on the placeholder arguments, never on binding
        patched(**CALL)
    except TypeError as exc:
        assert "kv_cache_specs" not in str(exc)
    except Exception:  # noqa: BLE001 (placeholders; the e2e test runs the real call)
        pass
