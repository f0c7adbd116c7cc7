"""cache_config_prefix_caching: hand-built requests with prefix caching on."""

from __future__ import annotations

from speculators_compat.oracle.reference import TOLERANCE
from speculators_compat.shims.cache_config_prefix_caching import SHIM
from tests.helpers import needs_claim, run_generator


def test_without_it_a_bare_assert_or_states_missing_for_shared_prefixes(claimed):
    needs_claim(claimed, SHIM)
    result = run_generator("llama-tiny", 6, disable=SHIM.name)
    if result["ok"]:  # no assert on this vLLM: the shared chat-template prefix was never computed
        assert any(isinstance(e, str) or e > TOLERANCE["float32"] for e in result["errors"])
    elif result["type"] == "AssertionError":  # vLLM 0.12-0.17: a bare assert on block_hashes
        assert result["message"] == ""
        assert "block_hashes" in result["traceback"] or "assert" in result["traceback"]
    else:  # vLLM 0.32: the block pool indexes hashes nobody computed
        assert result["type"] == "IndexError", result
        assert "cache_full_blocks" in result["traceback"]
