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
from tests.conftest import mla_skip_reason
from tests.helpers import run_generator
from tests.shims.conftest import needs_claim

pytestmark = pytest.mark.skipif(torch.cuda.is_available(), reason="CPU-backend shim")


def _forward_cpu_error() -> float:
    from vllm.model_executor.layers.rotary_embedding import RotaryEmbedding

    return rotation_error(RotaryEmbedding.forward_cpu)


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
