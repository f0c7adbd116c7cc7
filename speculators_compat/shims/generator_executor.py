"""Give speculators' generator a MultiprocExecutor subclass of its own.

Not a drift fix by itself: the executor shims (``executor_sample_tokens``,
``collective_rpc_unique_reply``, ``worker_error_details``) change how the *generator's*
executor behaves, and must not change vLLM's own ``MultiprocExecutor`` (an ``LLM`` with
tensor parallelism in the same process relies on its real behaviour). This shim binds the
generator module's ``MultiprocExecutor`` name to an empty subclass that those shims patch.
"""

from __future__ import annotations

from ..shim import Shim, replace_attr
from ._targets import GENERATOR, GENERATOR_REPLACED, module

NAME = "generator_executor"


def probe() -> bool:
    return not getattr(module(GENERATOR).MultiprocExecutor, "__speculators_compat_executor__", False)


def patch():
    gen = module(GENERATOR)
    base = gen.MultiprocExecutor
    sub = type(
        "CompatMultiprocExecutor",
        (base,),
        {"__speculators_compat_executor__": True, "__module__": __name__},
    )
    return replace_attr(gen, "MultiprocExecutor", sub, NAME)


SHIM = Shim(
    name=NAME,
    target=f"{GENERATOR}:MultiprocExecutor",
    vllm=">=0.11",
    symptom=(
        "none by itself: isolates the executor shims, so that vLLM's own MultiprocExecutor "
        "(used by LLM(...) in the same process) is never changed"
    ),
    upstream="none: isolates the executor shims from vLLM's own MultiprocExecutor",
    remove_when=f"with the last executor shim ({GENERATOR_REPLACED})",
    hook_module=GENERATOR,
    probe=probe,
    patch=patch,
)
