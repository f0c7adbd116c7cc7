"""draft_attention_autocast_dtype: the draft's attention runs under bfloat16 autocast
(``train --precision bf16``)."""

from __future__ import annotations

import pytest
from packaging.version import Version

from speculators_compat.shims.draft_attention_autocast_dtype import SHIM
from tests.helpers import needs_claim, run_draft

pytestmark = pytest.mark.training

# torch 2.11 lets flex attention's forward take float32 q/k with bfloat16 v (allow_lowp_kv) and
# refuses them only where it compiles the backward, on a GPU (a CPU has no flex backward)
LOWP_KV = Version("2.11")


def test_with_the_shim_attention_runs_in_bf16(claimed):
    """What the draft's layer hands its attention under autocast on a GPU (q and k promoted to
    float32 by the rotary embedding, v in bfloat16): with the shim, attention in bfloat16, equal
    to attention on inputs cast by hand."""
    needs_claim(claimed, SHIM)
    with_it = run_draft("attention_bf16")
    assert {k: with_it.get(k) for k in ("ok", "dtype", "max_difference")} == {
        "ok": True,
        "dtype": "torch.bfloat16",
        "max_difference": 0.0,
    }, with_it


def test_without_the_shim_flex_attention_refuses_the_mixed_dtypes(claimed):
    """Without the shim, torch before 2.11 refuses the mixed dtypes at the call (the error
    `train --precision bf16` dies of there). From 2.11 the forward takes them and only a GPU's
    compiled backward refuses them: that symptom is the GPU's, for the device call
    benchmarks/calls/issue29_bf16.sh to record."""
    needs_claim(claimed, SHIM)
    without = run_draft("attention_bf16", disable=SHIM.name)
    if "torch" in without and Version(Version(without["torch"]).base_version) >= LOWP_KV:
        assert without.get("ok"), without
        pytest.skip(f"torch {without['torch']} refuses mixed q/k/v dtypes only in a GPU's backward")
    assert without["error_type"] == "ValueError", without
    assert "Expected query, key, and value to have the same dtype" in without["error"]
    assert "value.dtype: torch.bfloat16" in without["error"]
