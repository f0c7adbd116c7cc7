"""Prefix caching must be off for hidden-state extraction.

With prefix caching on (vLLM's default for decoder models in newer releases), blocks that an
earlier request already filled are reused and never prefilled again: their hidden states are
never computed, so sequences that share a prefix (a chat template, a system prompt) come back
with fewer states than tokens. Requests built by hand, as speculators 0.3.0 builds them, also
have no block hasher, and the KV-cache manager asserts on ``request.block_hashes``. The shim
creates speculators' ``CacheConfig`` with ``enable_prefix_caching=False``.

Probe: a default ``CacheConfig`` turns prefix caching on (vLLM >= 0.12: ``True``; 0.11 left it
``None``, which the hand-built engine treats as off).
"""

from __future__ import annotations

from ..shim import Shim
from ._targets import GENERATOR, module, rewrite_call

NAME = "cache_config_prefix_caching"


def probe() -> bool:
    cfg = module(GENERATOR).CacheConfig(block_size=16)
    return bool(getattr(cfg, "enable_prefix_caching", None))


def patch():
    return rewrite_call("CacheConfig", NAME, lambda _args, kw: kw.setdefault("enable_prefix_caching", False))


SHIM = Shim(
    name=NAME,
    target=f"{GENERATOR}:CacheConfig",
    vllm=">=0.12",
    symptom="AssertionError (bare) on request.block_hashes in the KV-cache manager (vLLM 0.32: "
    "IndexError: list index out of range in BlockPool.cache_full_blocks); or, where it does not "
    "fail, sequences sharing a prefix get fewer hidden states than tokens",
    upstream="speculators PRs #225 (block hasher) and #283 (prefix caching off)",
    remove_when="speculators 0.4.0",
    hook_module=GENERATOR,
    probe=probe,
    patch=patch,
)
