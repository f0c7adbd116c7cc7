"""vLLM 0.32-0.33, CPU: worker start-up fails in a process that imported numba (llvmlite).

vLLM 0.34 fixed it upstream (``_rebind_impls`` reads only a real ``dict``); the probe finds no
``_rebind_kernels`` there.

When a worker starts, vLLM's CPU platform points every reference to some Triton kernels at CPU
replacements (``vllm.triton_utils.dispatcher._rebind_kernels``): it scans the namespace of every
module in ``sys.modules`` and reads ``vars(value).get("kernel")`` for each value that has a
``__dict__``. llvmlite's ctypes wrappers answer any attribute, ``__dict__`` included, with
another wrapper, so the scan raises as soon as numba has been imported in the process (vLLM
itself imports it for n-gram speculation, as do data tools): the engine never starts.

The shim hides, for the length of the scan only, the modules whose namespace such a value would
break (none of them holds a Triton kernel), then puts them back.

Probe: the scan raises on a module holding a value whose ``vars()`` is not a mapping.
"""

from __future__ import annotations

import sys
import types

from ..shim import Shim, replace_attr
from ._targets import module

NAME = "kernel_rebind_scan"
HOOK = "vllm.triton_utils.dispatcher"


class _AnswersEverything:
    """Like llvmlite's ``_lib_fn_wrapper``: any attribute, ``__dict__`` included, is a wrapper."""

    __slots__ = ()

    def __getattr__(self, name):
        return _AnswersEverything()


def _unreadable(value) -> bool:
    try:
        return hasattr(value, "__dict__") and not hasattr(vars(value), "get")
    except Exception:  # noqa: BLE001 (anything the scan could trip over)
        return True


def probe() -> bool:
    try:
        rebind = getattr(module(HOOK), "_rebind_kernels", None)
    except ModuleNotFoundError:  # releases before the kernel dispatcher (<= 0.17)
        return False
    if rebind is None:
        return False
    name = "_speculators_compat_probe_module"
    sys.modules[name] = probe_module = types.ModuleType(name)
    probe_module.value = _AnswersEverything()
    try:
        rebind([])
    except Exception:  # noqa: BLE001 (the scan could not read the module: the drift)
        return True
    finally:
        del sys.modules[name]
    return False


def patch():
    mod = module(HOOK)
    original = mod._rebind_kernels

    def _rebind_kernels(overrides):
        hidden = {}
        for name, m in list(sys.modules.items()):
            namespace = getattr(m, "__dict__", None)
            if namespace and any(_unreadable(v) for v in list(namespace.values())):
                hidden[name] = sys.modules.pop(name)
        try:
            return original(overrides)
        finally:
            sys.modules.update(hidden)

    return replace_attr(mod, "_rebind_kernels", _rebind_kernels, NAME)


SHIM = Shim(
    name=NAME,
    target=f"{HOOK}:_rebind_kernels",
    vllm=">=0.32,<0.34",
    symptom="AttributeError: '_lib_fn_wrapper' object has no attribute 'get' (engine start-up in a "
    "process that imported numba)",
    upstream="none found; vLLM 0.34's _rebind_impls reads only a real dict",
    remove_when="vLLM 0.34 (fixed there; the shim's range ends at 0.33)",
    hook_module=HOOK,
    probe=probe,
    patch=patch,
    serving=True,  # vLLM's own engine fails the same way (prepare --regenerate, serve-check)
)
