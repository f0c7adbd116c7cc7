"""vLLM >= 0.12: ``collective_rpc(..., unique_reply_rank=r)`` returns the reply itself.

On vLLM 0.11 it returned a one-item list, and speculators 0.3.0 takes ``[0]`` of it. From 0.12
that ``[0]`` silently takes the first element *of the reply*: for ``_get_captured_states`` the
first layer's tensor, whose rows speculators then reads as layers. The shim restores the
one-item list for calls to the speculators worker extension's own methods only: vLLM's own
calls through the same executor keep the new convention.

Probe: the source of ``MultiprocExecutor.collective_rpc`` returns ``responses[0]``.
"""

from __future__ import annotations

import inspect

from ..shim import Shim, replace_attr
from ._targets import GENERATOR, WORKER, compat_executor_class, inherited, module

NAME = "collective_rpc_unique_reply"


def probe() -> bool:
    source = inspect.getsource(module(GENERATOR).MultiprocExecutor.collective_rpc)
    return "responses[0]" in source


def _is_extension_method(method) -> bool:
    ext = module(WORKER).HiddenStatesWorkerExtension
    return isinstance(method, str) and method.startswith("_") and method in vars(ext)


def patch():
    cls = compat_executor_class()
    base = inherited(cls, "collective_rpc")

    def collective_rpc(self, method, *args, unique_reply_rank=None, **kwargs):
        result = base(self, method, *args, unique_reply_rank=unique_reply_rank, **kwargs)
        if unique_reply_rank is not None and _is_extension_method(method):
            return [result]
        return result

    return replace_attr(cls, "collective_rpc", collective_rpc, NAME)


SHIM = Shim(
    name=NAME,
    target=f"{GENERATOR}:MultiprocExecutor.collective_rpc",
    vllm=">=0.11.1",
    symptom="RuntimeError: Boolean value of Tensor with more than one value is ambiguous "
    "(speculators' captured_states_list[0] is the first layer's tensor, not the list of layers)",
    upstream="speculators PR #283 (states keyed by request)",
    remove_when="speculators 0.4.0",
    hook_module=GENERATOR,
    probe=probe,
    patch=patch,
    requires=("generator_executor",),
)
