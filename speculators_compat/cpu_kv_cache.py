"""How much memory vLLM's CPU backend gives the KV cache when no one said: what the engine needs.

vLLM's CPU platform sizes the KV cache from ``VLLM_CPU_KVCACHE_SPACE`` (GiB). Unset, current
builds take half the machine's memory (per NUMA node: ``VLLM_CPU_KVCACHE_SPACE not set. Using
11.7 GiB for KV cache.``) and every worker allocates it zero-filled: a `demo` or `preflight` on a
developer's machine holds half its memory for a model that needs kilobytes, two tensor-parallel
workers hold all of it, and serve-check's engines run one after the other at that size.

:func:`choose` sizes it from the model's config for the engine's own limits (``max_num_seqs``
sequences of ``max_model_len`` tokens), rounded up to whole GiB, at least 1 and at most vLLM's own
default. :func:`apply` sets ``VLLM_CPU_KVCACHE_SPACE`` to it unless the user set the variable
(theirs stands), marks the value as ours in ``SPECULATORS_COMPAT_KVCACHE_SPACE_SET`` (a process
started from this one chooses again for its own model), and logs why. Used by the
``generator_cpu_memory`` shim (speculators' generator) and the serve-check / regenerate engines.
On GPUs nothing is chosen.
"""

from __future__ import annotations

import logging
import math
import os
from dataclasses import dataclass
from pathlib import Path

from . import cpu_mla
from .text_model import read_text_config

log = logging.getLogger("speculators_compat")

ENV = "VLLM_CPU_KVCACHE_SPACE"
OWNED_ENV = "SPECULATORS_COMPAT_KVCACHE_SPACE_SET"
GIB = 2**30
#: Room above the sequences' own bytes (block rounding, the scheduler's watermark).
MARGIN = 1.25


@dataclass(frozen=True)
class KvCacheChoice:
    gib: int
    reason: str


def bytes_per_token(model: str | Path, use_mla: bool, dtype_bytes: int = 4, extra_layers: int = 0) -> int:
    """KV-cache bytes one token takes in every attention layer of ``model``, as vLLM stores it:
    the latent (``kv_lora_rank + qk_rope_head_dim``) with MLA, keys and values otherwise.
    ``dtype_bytes``: 4 (float32, the most any CPU engine here uses) unless told;
    ``extra_layers``: layers of the same size sharing the cache (a draft's)."""
    text = read_text_config(model)
    layers = int(text["num_hidden_layers"])
    heads = int(text["num_attention_heads"])
    if text.get("kv_lora_rank") is not None:
        rope = int(text.get("qk_rope_head_dim") or 0)
        if use_mla:
            per_layer = int(text["kv_lora_rank"]) + rope
        else:  # MLA off: every head's keys (nope + rope) and values
            key = int(text.get("qk_nope_head_dim") or 0) + rope
            per_layer = 2 * heads * max(key, int(text.get("v_head_dim") or key))
    else:
        kv_heads = int(text.get("num_key_value_heads") or heads)
        head_dim = int(text.get("head_dim") or int(text["hidden_size"]) // heads)
        per_layer = 2 * kv_heads * head_dim
    return (layers + extra_layers) * per_layer * dtype_bytes


def vllm_default_bytes() -> int:
    """What vLLM's CPU platform takes when the variable is unset: half the memory of a NUMA node."""
    import psutil

    node_dir = Path("/sys/devices/system/node")
    nodes = len(list(node_dir.glob("node[0-9]*"))) if node_dir.is_dir() else 0
    return psutil.virtual_memory().total // max(nodes, 1) // 2


def choose(
    model: str | Path, max_model_len: int, max_num_seqs: int, extra_layers: int = 0
) -> KvCacheChoice | None:
    """The KV-cache size for an engine on ``model`` with these limits (``extra_layers``: a draft's
    own layers sharing the cache); None on a GPU or for a config this cannot read."""
    import torch

    if torch.cuda.is_available():
        return None

    mla = cpu_mla.choose(model)
    try:
        per_token = bytes_per_token(model, mla is not None and mla.use_mla, extra_layers=extra_layers)
    except (KeyError, TypeError, ValueError, OSError) as exc:
        log.info("KV cache: vLLM's default (the model's config does not give its size: %r)", exc)
        return None
    need = per_token * max_model_len * max_num_seqs
    default = vllm_default_bytes()
    wanted = max(1, math.ceil(need * MARGIN / GIB))
    gib = max(1, min(wanted, default // GIB))
    what = (
        f"{max_num_seqs} sequences of {max_model_len} tokens at {per_token} bytes per token need "
        f"{need / GIB:.3g} GiB"
    )
    if gib < wanted:
        reason = f"{gib} GiB, vLLM's own default (half the memory): {what}, so fewer run at once"
    else:
        reason = (
            f"{gib} GiB: {what} (vLLM's own default, half the memory, would be {default / GIB:.1f} "
            "GiB in every worker)"
        )
    return KvCacheChoice(gib, f"{reason}; export {ENV} to choose")


def apply(choice: KvCacheChoice | None) -> KvCacheChoice | None:
    """Set ``$VLLM_CPU_KVCACHE_SPACE`` for ``choice`` unless the user set it; return the choice in
    force (None: nothing chosen, or the user's value stands)."""
    current = os.environ.get(ENV)
    if choice is None or (current is not None and current != os.environ.get(OWNED_ENV)):
        return None
    os.environ[ENV] = os.environ[OWNED_ENV] = str(choice.gib)
    try:  # an in-process engine may have frozen vLLM's environment (envs.enable_envs_cache)
        from vllm import envs

        if hasattr(envs, "disable_envs_cache"):
            envs.disable_envs_cache()
    except ImportError:
        pass
    log.info("KV cache on CPU: %s", choice.reason)
    return choice
