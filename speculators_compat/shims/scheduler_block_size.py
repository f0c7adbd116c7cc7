"""vLLM >= 0.12: ``Scheduler(...)`` requires ``block_size``.

Probe: ``block_size`` is a parameter of ``Scheduler.__init__`` without a default. The shim passes
the cache config's block size, as vLLM's engine core does.
"""

from __future__ import annotations

from ..shim import Shim
from ._targets import GENERATOR, module, requires, rewrite_call

NAME = "scheduler_block_size"


def probe() -> bool:
    return requires(module(GENERATOR).Scheduler.__init__, "block_size")


def _add_block_size(args: tuple, kwargs: dict) -> None:
    if "block_size" not in kwargs:
        vllm_config = kwargs.get("vllm_config") or args[0]
        kwargs["block_size"] = vllm_config.cache_config.block_size


def patch():
    return rewrite_call("Scheduler", NAME, _add_block_size)


SHIM = Shim(
    name=NAME,
    target=f"{GENERATOR}:Scheduler",
    vllm=">=0.11.1",
    symptom="TypeError: Scheduler.__init__() missing 1 required positional argument: 'block_size'",
    upstream="speculators PR #225 (vLLM 0.12)",
    remove_when="speculators 0.4.0",
    hook_module=GENERATOR,
    probe=probe,
    patch=patch,
)
