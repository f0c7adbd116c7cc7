"""vLLM >= 0.33: the KV cache planning functions speculators imports left ``kv_cache_utils``.

speculators 0.3.0's generator module starts with ``from vllm.v1.core.kv_cache_utils import
(_get_kv_cache_groups_uniform_spec, get_kv_cache_config_from_groups, unify_hybrid_kv_cache_specs)``;
vLLM 0.33 moved the three to ``vllm.v1.core.kv_cache_planning``, so the import fails before any
shim hooked on the generator can run.

Probe: ``kv_cache_utils`` lacks one of the names and ``kv_cache_planning`` has all three. The shim
makes ``kv_cache_utils`` name them again (the same functions; the calls' own drift is
``kv_cache_config_specs``'s), as soon as ``kv_cache_utils`` is imported, which vLLM does before
speculators' import line runs. Undo removes the names again. The names are recorded as the
shim's (:func:`speculators_compat.shim.add_names`), so ``doctor`` reports the move instead of them.
"""

from __future__ import annotations

from ..shim import Shim, add_names
from ._targets import GENERATOR_REPLACED, module

NAME = "kv_cache_utils_moved"
UTILS = "vllm.v1.core.kv_cache_utils"
PLANNING = "vllm.v1.core.kv_cache_planning"
NAMES = (
    "_get_kv_cache_groups_uniform_spec",
    "get_kv_cache_config_from_groups",
    "unify_hybrid_kv_cache_specs",
)


def probe() -> bool:
    utils = module(UTILS)
    if all(hasattr(utils, n) for n in NAMES):
        return False
    try:
        planning = module(PLANNING)
    except ModuleNotFoundError:
        return False  # gone without a successor: nothing to point at (doctor reports it)
    return all(hasattr(planning, n) for n in NAMES)


def patch():
    utils, planning = module(UTILS), module(PLANNING)
    return add_names(utils, {name: getattr(planning, name) for name in NAMES}, NAME)


SHIM = Shim(
    name=NAME,
    target=f"{UTILS}:{','.join(NAMES)}",
    vllm=">=0.33",
    symptom="ImportError: cannot import name '_get_kv_cache_groups_uniform_spec' from "
    "'vllm.v1.core.kv_cache_utils'",
    upstream="none found (speculators 0.3.0 imports names vLLM 0.33 moved)",
    remove_when=GENERATOR_REPLACED,
    hook_module=UTILS,
    probe=probe,
    patch=patch,
)
