"""cpu_rotary_embedding_3d: vLLM's CPU rotary op on DeepSeek's per-head queries.

The op itself, with and without the shim, on DeepSeek's layout; then the symptom where users
meet it: speculators' generator on a DeepSeek-V3 whose attention depends on positions
(``deepseek-v3-tiny-sharp``: plain RoPE, sharpened q/k), MLA off and, where the CPU build has it,
on, held to the float32 oracle tolerance with the shim and far outside it without.
"""

from __future__ import annotations

import pytest
import torch

import speculators_compat
from speculators_compat.oracle.reference import tolerance
from speculators_compat.shims.cpu_rotary_embedding_3d import SHIM, rotation_error
from tests.helpers import mla_skip_reason, needs_claim, run_generator

pytestmark = pytest.mark.skipif(torch.cuda.is_available(), reason="CPU-backend shim")


def _forward_cpu_error() -> float:
    from vllm import _custom_ops

    return rotation_error(_custom_ops.rotary_embedding)


def test_a_rotary_embedding_that_computes_natively_is_left_as_it_is():
    """DeepseekScalingRotaryEmbedding (YaRN, as DeepSeek-V3 and Kimi-K2.5 ship) computes its CPU
    path natively, on the per-head layout: through vLLM's own dispatch, with the shim applied, it
    still agrees with forward_native (an earlier version of the shim flattened its input there)."""
    from vllm.model_executor.layers.rotary_embedding import DeepseekScalingRotaryEmbedding

    from speculators_compat.shims.cpu_rms_norm_strided import _cpu_config_context

    speculators_compat.apply_now()
    with _cpu_config_context():
        # head_size, rotary_dim, max_position, base, is_neox_style, scaling_factor, dtype
        rope = DeepseekScalingRotaryEmbedding(16, 16, 1024, 50000.0, False, 4.0, torch.float32)
        gen = torch.Generator().manual_seed(0)
        query = torch.randn(5, 4, 64, generator=gen)[..., 48:]
        key = torch.randn(5, 1, 48, generator=gen)[..., 32:]
        positions = torch.arange(3, 8)
        want_q, want_k = rope.forward_native(positions, query.clone(), key.clone())
        got_q, got_k = rope(positions, query.clone(), key.clone())
    assert float((got_q - want_q).abs().max()) < 1e-5
    assert float((got_k - want_k).abs().max()) < 1e-5


def test_the_op_rotates_per_head_queries_only_with_the_shim(claimed):
    speculators_compat.apply_now()
    state = {s.shim.name: s.state for s in speculators_compat.status()}[SHIM.name]
    assert state == ("applied" if claimed(SHIM) else "not needed")
    assert _forward_cpu_error() < 1e-6
    speculators_compat.unpatch()
    try:
        unpatched = _forward_cpu_error()
    finally:
        speculators_compat.apply_now()
    if claimed(SHIM):
        assert unpatched > 1.0  # queries rotated at other tokens' positions, or not at all
    else:
        assert unpatched < 1e-6


@pytest.mark.parametrize("recipe", ["deepseek-v3-tiny-sharp", "deepseek-v3-tiny-mla-sharp"])
def test_without_it_deepseek_states_ignore_positions_and_with_it_they_match(claimed, recipe):
    needs_claim(claimed, SHIM)
    reason = mla_skip_reason(recipe)
    if reason:
        pytest.skip(reason)
    without = run_generator(recipe, 6, disable=SHIM.name)
    assert without["ok"], without.get("message")  # silently wrong: no error at all
    assert min(without["errors"]) > 0.3, without["errors"]
    with_it = run_generator(recipe, 6)
    assert with_it["ok"], with_it.get("message")
    assert with_it["status"][SHIM.name] == "applied"
    assert max(with_it["errors"]) <= tolerance("float32", sharp=True), with_it["errors"]
