"""cpu_attention_block_size: speculators' 16-token KV blocks on CPU kernels that take 32 and up."""

from __future__ import annotations

from speculators_compat.oracle.reference import TOLERANCE
from speculators_compat.shims.cpu_attention_block_size import SHIM, cpu_block_size
from tests.helpers import needs_claim, run_generator


def test_the_generator_block_size_is_one_vllm_accepts(state):
    """vLLM's own check (``AttentionBackend.supports_block_size``), not the shim's probe, says
    whether speculators' 16 needed changing and whether the block size in use is valid."""
    import speculators.data_generation.vllm_hidden_states_generator as gen

    backend = cpu_attention_backend()
    if backend is None:  # TorchSDPABackend (older releases) takes any size
        assert gen.VLLM_BLOCK_SIZE == 16 and state(SHIM) == "not needed"
        return
    assert backend.supports_block_size(gen.VLLM_BLOCK_SIZE)
    assert (state(SHIM) == "applied") == (not backend.supports_block_size(16))
    assert (gen.VLLM_BLOCK_SIZE != 16) == (state(SHIM) == "applied")


def cpu_attention_backend():
    """vLLM's CPU attention backend class, where it has one that checks block sizes."""
    try:
        from vllm.v1.attention.backends.cpu_attn import CPUAttentionBackend
    except ImportError:
        return None
    return CPUAttentionBackend if hasattr(CPUAttentionBackend, "supports_block_size") else None


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
