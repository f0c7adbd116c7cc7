"""vLLM >= 0.12: ``get_kv_cache_config_from_groups`` lost its ``kv_cache_specs`` argument.

Probe: the function does not accept ``kv_cache_specs``. The shim drops the argument.
"""

from __future__ import annotations

from ..shim import Shim
from ._targets import GENERATOR, accepts, module, rewrite_call

NAME = "kv_cache_config_specs"


def probe() -> bool:
    return not accepts(module(GENERATOR).get_kv_cache_config_from_groups, "kv_cache_specs")


def patch():
    return rewrite_call(
        "get_kv_cache_config_from_groups", NAME, lambda _args, kw: kw.pop("kv_cache_specs", None)
    )


SHIM = Shim(
    name=NAME,
    target=f"{GENERATOR}:get_kv_cache_config_from_groups",
    vllm=">=0.12",
    symptom="TypeError: get_kv_cache_config_from_groups() got an unexpected keyword argument "
    "'kv_cache_specs'",
    upstream="speculators PR #225 (vLLM 0.12)",
    remove_when="speculators 0.4.0",
    hook_module=GENERATOR,
    probe=probe,
    patch=patch,
)
