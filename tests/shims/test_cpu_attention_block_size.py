"""cpu_attention_block_size: speculators' 16-token KV blocks on CPU kernels that take 32 and up."""

from __future__ import annotations

from speculators_compat.reference import TOLERANCE
from speculators_compat.shims.cpu_attention_block_size import SHIM, cpu_block_size
from tests.helpers import run_generator
from tests.shims.conftest import needs_claim


def test_the_generator_block_size_is_one_the_cpu_kernels_take(state):
    import speculators.data_generation.vllm_hidden_states_generator as gen

    assert cpu_block_size(16) == gen.VLLM_BLOCK_SIZE
    assert (gen.VLLM_BLOCK_SIZE != 16) == (state(SHIM) == "applied") == probe_on_original()


def probe_on_original() -> bool:
    """The probe, asked about speculators' own value (16)."""
    return cpu_block_size(16) != 16


def test_without_it_the_kv_cache_has_no_common_block_size(claimed):
    needs_claim(claimed, SHIM)
    if cpu_block_size() == 16:
        import pytest

        pytest.skip("this vLLM's CPU attention takes 16-token blocks (the probe finds no drift)")
    result = run_generator("llama-tiny", 3, disable=SHIM.name)
    assert not result["ok"], result
    assert "No common block size for 16" in result["message"] + result["traceback"]
    fixed = run_generator("llama-tiny", 3)
    assert fixed["ok"] and fixed["status"][SHIM.name] == "applied", fixed
    assert max(fixed["errors"]) <= TOLERANCE["float32"]
