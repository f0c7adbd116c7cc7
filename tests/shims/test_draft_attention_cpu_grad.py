"""draft_attention_cpu_grad: the draft trains on CPU under torch >= 2.11, with the same attention."""

from __future__ import annotations

import pytest
import torch

from speculators_compat.shims.draft_attention_cpu_grad import ATTENTION, SHIM
from tests.helpers import needs_claim, run_draft

pytestmark = [pytest.mark.training, pytest.mark.skipif(torch.cuda.is_available(), reason="CPU-only shim")]


def test_training_step_on_cpu(claimed):
    needs_claim(claimed, SHIM)
    assert run_draft("step") == {"ok": True}
    without = run_draft("step", disable=SHIM.name)
    assert without["error_type"] == "NotImplementedError", without
    assert "FlexAttention does not support backward on CPU" in without["error"]


def test_dense_attention_equals_flex_attention_on_speculators_mask(claimed, state):
    """speculators' packed-document mask, extended for two draft steps as its TTT loop does:
    the shim's attention (with grad) equals flex attention's (without grad), and has gradients."""
    needs_claim(claimed, SHIM)
    assert state(SHIM) == "applied"
    import importlib

    from torch.nn.attention.flex_attention import create_block_mask, flex_attention

    attention = importlib.import_module(ATTENTION)
    total = 256
    lengths = torch.tensor([100, 60, 70])  # three documents and 26 padding positions
    mask_mod = attention.create_combined_mask_mod(lengths, total)
    block_mask = create_block_mask(mask_mod, None, None, total, total, device="cpu")
    g = torch.Generator().manual_seed(0)
    for step in range(3):
        kv_len = total * (step + 1)
        q = torch.randn(1, 4, total, 32, generator=g)
        k, v = torch.randn(1, 2, kv_len, 32, generator=g), torch.randn(1, 2, kv_len, 32, generator=g)
        with torch.no_grad():
            expected = flex_attention(q, k, v, block_mask=block_mask, scale=0.2, enable_gqa=True)
        qg = q.clone().requires_grad_()
        got = attention.flex_attention(qg, k, v, block_mask=block_mask, scale=0.2, enable_gqa=True)
        assert (got - expected).abs().max().item() < 1e-5
        got.sum().backward()
        assert qg.grad is not None and torch.isfinite(qg.grad).all() and qg.grad.abs().sum() > 0
        block_mask = attention.extend_mask_for_draft_tokens(block_mask)
