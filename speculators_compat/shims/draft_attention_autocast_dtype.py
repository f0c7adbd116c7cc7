"""The draft's attention under autocast (``train --precision bf16``): one dtype for q, k and v.

speculators 0.3.0's draft layer is transformers' Llama layer: under ``torch.autocast`` its q, k
and v projections come out in bfloat16, then the rotary embedding multiplies q and k by cos/sin
made in the dtype of the layer's float32 input, which promotes them back to float32, while v
stays bfloat16. speculators' ``simple_flex_attention`` passes them on as they are. Before torch
2.11 flex attention refuses mixed dtypes at the first training step: ``ValueError: Expected
query, key, and value to have the same dtype, but got query.dtype: torch.float32, key.dtype:
torch.float32, and value.dtype: torch.bfloat16 instead.`` (reproduced on a CPU, torch 2.8 and
2.10). From 2.11 the forward takes them (``allow_lowp_kv``) and Inductor refuses them where it
compiles the backward, on a GPU: ``Backward pass with mixed query, key, and value dtype is not
supported`` (torch's ``_inductor/kernel/flex/flex_attention.py``; a CPU has no flex backward).

The shim casts q, k and v to autocast's dtype where autocast is on and they differ (to v's dtype
where it is off), around speculators' module-level ``flex_attention`` (outside
``draft_attention_cpu_grad``'s replacement on a CPU, which it then calls). Where the dtypes
agree (fp32/tf32 training, serving) nothing changes.

Probe: speculators' ``flex_attention_forward`` hands q, k and v to flex attention without a cast.
"""

from __future__ import annotations

import inspect

from ..shim import Shim, replace_attr
from ._targets import module

NAME = "draft_attention_autocast_dtype"
ATTENTION = "speculators.models.eagle3.attention"


def probe() -> bool:
    source = inspect.getsource(inspect.unwrap(module(ATTENTION).flex_attention_forward))
    return "flex_attention(" in source and ".to(" not in source and "dtype" not in source


def common_dtype(query, key, value):
    """The dtype attention runs in: autocast's on the inputs' device where it is on, else v's."""
    import torch

    device = query.device.type
    if torch.is_autocast_enabled(device):
        return torch.get_autocast_dtype(device)
    return value.dtype


def patch():
    mod = module(ATTENTION)
    original = mod.flex_attention

    def flex_attention(query, key, value, *args, **kwargs):
        if not query.dtype == key.dtype == value.dtype:
            dtype = common_dtype(query, key, value)
            query, key, value = query.to(dtype), key.to(dtype), value.to(dtype)
        return original(query, key, value, *args, **kwargs)

    return replace_attr(mod, "flex_attention", flex_attention, NAME)


SHIM = Shim(
    name=NAME,
    target=f"{ATTENTION}:flex_attention",
    vllm=">=0.11",
    symptom="ValueError: Expected query, key, and value to have the same dtype, but got query.dtype: "
    "torch.float32, key.dtype: torch.float32, and value.dtype: torch.bfloat16 instead.",
    upstream="none found (speculators 0.3.0 trains in float32 and never autocasts)",
    remove_when="never on speculators 0.3.x (bf16 autocast is ours)",
    hook_module=ATTENTION,
    probe=probe,
    patch=patch,
)
