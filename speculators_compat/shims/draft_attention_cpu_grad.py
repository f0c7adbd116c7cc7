"""CPU, torch >= 2.11: the draft's flex attention refuses to train.

speculators 0.3.0's draft attention (``simple_flex_attention``) calls
``torch.nn.attention.flex_attention.flex_attention`` with its packed-document block mask. From
torch 2.11 (what vLLM's CPU builds pin from 0.20 on) flex attention refuses inputs that require
grad on CPU, so the first training step fails: ``NotImplementedError: FlexAttention does not
support backward on CPU. Please set the input requires_grad to False or use another device.``
(torch 2.8-2.10 ran it eagerly.) The shim computes the same attention where flex attention
refuses: the block mask's own ``mask_mod`` made dense (``create_mask``) and
``scaled_dot_product_attention`` with it, which has a backward on CPU. Elsewhere (no grad, or a
GPU) flex attention runs as before.

Probe: flex attention's device check (or, where it has none, flex attention itself) refuses a CPU
input that requires grad with that NotImplementedError.
"""

from __future__ import annotations

from ..shim import Shim, replace_attr
from ._targets import module

NAME = "draft_attention_cpu_grad"
ATTENTION = "speculators.models.eagle3.attention"


def probe() -> bool:
    import torch
    from torch.nn.attention import flex_attention as flex

    q = torch.zeros(1, 1, 16, 16, requires_grad=True)
    # The refusal is one of the eager checks made before compiling (``_validate_device`` in torch
    # 2.11-2.14): asked alone, the probe costs microseconds where the whole call would compile
    # the attention (0.5 s on torch 2.10, which accepts the input).
    check = getattr(flex, "_validate_device", None)
    try:
        if check is not None:
            check(q, q, q)
        else:
            flex.flex_attention(q, q, q)
    except NotImplementedError as exc:
        return "backward on CPU" in str(exc)
    return False


def patch():
    import torch
    import torch.nn.functional as F
    from torch.nn.attention.flex_attention import create_mask

    mod = module(ATTENTION)
    original = mod.flex_attention

    def flex_attention(
        query, key, value, score_mod=None, block_mask=None, scale=None, enable_gqa=False, **kw
    ):
        refused = (
            query.device.type == "cpu"
            and torch.is_grad_enabled()
            and (query.requires_grad or key.requires_grad or value.requires_grad)
        )
        if not refused or score_mod is not None or block_mask is None or kw:
            return original(
                query, key, value, score_mod=score_mod, block_mask=block_mask, scale=scale,
                enable_gqa=enable_gqa, **kw,
            )  # fmt: skip
        mask = create_mask(block_mask.mask_mod, None, None, query.shape[-2], key.shape[-2], query.device)
        return F.scaled_dot_product_attention(
            query, key, value, attn_mask=mask, scale=scale, enable_gqa=enable_gqa
        )

    return replace_attr(mod, "flex_attention", flex_attention, NAME)


SHIM = Shim(
    name=NAME,
    target=f"{ATTENTION}:flex_attention",
    # The drift is torch's (2.11+); vLLM's CPU builds pin torch 2.11 from 0.20 on.
    vllm=">=0.20",
    symptom="NotImplementedError: FlexAttention does not support backward on CPU. Please set the "
    "input requires_grad to False or use another device.",
    upstream="none found (torch's FlexAttention has no CPU backward)",
    remove_when="a torch whose FlexAttention has a CPU backward (not up to 2.13)",
    hook_module=ATTENTION,
    probe=probe,
    patch=patch,
    platform="cpu",
)
