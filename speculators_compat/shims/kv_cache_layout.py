"""vLLM >= 0.29 (0.28's wheel has no such step, 0.29's has; tested on 0.32): the engine core
resolves one KV-cache layout before the KV cache is sized, and ``get_kv_cache_config_from_groups``
refuses to run without it.

speculators 0.3.0 builds the KV cache itself (no engine core), so nothing resolves the layout.
The shim does what vLLM's engine core does right after building its executor: ask the workers
which layouts their attention backends support, resolve one (``resolve_kv_cache_layout``) and
publish it to the workers (``set_kv_cache_layout``), on the generator's own executor.

Probe: ``CacheConfig`` has ``get_resolved_kv_cache_layout`` (the layout must be resolved) and the
executor has ``set_kv_cache_layout``.
"""

from __future__ import annotations

from ..shim import Shim, replace_attr
from ._targets import GENERATOR, GENERATOR_REPLACED, compat_executor_class, module

NAME = "kv_cache_layout"


def probe() -> bool:
    from vllm.config import CacheConfig  # the generator's name may be a shim's call wrapper

    return hasattr(CacheConfig, "get_resolved_kv_cache_layout") and hasattr(
        module(GENERATOR).MultiprocExecutor, "set_kv_cache_layout"
    )


def patch():
    from vllm.v1.attention.backends.utils import resolve_kv_cache_layout

    cls = compat_executor_class()
    base_init = cls.__init__

    def __init__(self, *args, **kwargs):
        base_init(self, *args, **kwargs)
        if self.vllm_config.cache_config.kv_cache_layout is None:
            specs = [spec for per_rank in self.get_kv_cache_specs() for spec in per_rank.values()]
            layout = resolve_kv_cache_layout(self.vllm_config, self.get_supported_kv_cache_layouts(), specs)
            self.set_kv_cache_layout(layout.name)

    return replace_attr(cls, "__init__", __init__, NAME)


SHIM = Shim(
    name=NAME,
    target=f"{GENERATOR}:MultiprocExecutor.__init__",
    vllm=">=0.29",
    symptom="ValueError: KV cache layout has not been resolved yet; it is resolved once by the "
    "engine core (resolve_kv_cache_layout) unless explicitly set by the user.",
    upstream="none found (speculators 0.4.0 supports vLLM up to 0.16)",
    remove_when=GENERATOR_REPLACED,
    hook_module=GENERATOR,
    probe=probe,
    patch=patch,
    requires=("generator_executor",),
)
