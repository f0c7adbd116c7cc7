"""Modules the shims hook on, and small helpers they share."""

from __future__ import annotations

import functools
import importlib
import inspect
from collections.abc import Callable

from ..shim import replace_attr

GENERATOR = "speculators.data_generation.vllm_hidden_states_generator"
WORKER = "speculators.data_generation.custom_worker"


def module(name: str):
    return importlib.import_module(name)


def accepts(func, parameter: str) -> bool:
    try:
        return parameter in inspect.signature(func).parameters
    except (TypeError, ValueError):
        return False


def requires(func, parameter: str) -> bool:
    """``parameter`` is in the signature with no default."""
    try:
        p = inspect.signature(func).parameters.get(parameter)
    except (TypeError, ValueError):
        return False
    return p is not None and p.default is inspect.Parameter.empty


def compat_executor_class():
    """The MultiprocExecutor subclass the generator uses (installed by ``generator_executor``)."""
    cls = module(GENERATOR).MultiprocExecutor
    if not getattr(cls, "__speculators_compat_executor__", False):
        raise RuntimeError("the generator_executor shim is not applied; executor shims need it")
    return cls


def inherited(cls, name: str):
    """``cls.name`` as a plain function: its own, else the first base's that defines it."""
    for klass in cls.__mro__:
        if name in vars(klass):
            return vars(klass)[name]
    raise AttributeError(f"{cls.__name__} has no {name}")


def rewrite_call(attr: str, shim: str, rewrite: Callable[[tuple, dict], None]):
    """Bind the generator module's ``attr`` to a callable that lets ``rewrite(args, kwargs)``
    adjust the keyword arguments of each call, then calls the original. Returns the undo."""
    gen = module(GENERATOR)
    original = getattr(gen, attr)

    def call(*args, **kwargs):
        rewrite(args, kwargs)
        return original(*args, **kwargs)

    call.__name__ = call.__qualname__ = attr
    return replace_attr(gen, attr, call, shim)


DRAFT = "speculators.models.eagle3.core"
CHECKPOINTER = "speculators.train.checkpointer"
TRAINER = "speculators.train.trainer"
TRAIN_UTILS = "speculators.train.utils"


def raising_instead(original, translate, catch: type[BaseException] = Exception):
    """``original``, except that an exception it raises is replaced by ``translate(exc, *args)``
    (raised from it) where that returns one; where it returns None the original propagates."""

    @functools.wraps(original)
    def call(*args, **kwargs):
        try:
            return original(*args, **kwargs)
        except catch as exc:
            replacement = translate(exc, *args)
            if replacement is None:
                raise
            raise replacement from exc

    return call


#: ``remove_when`` of the shims of speculators 0.3.0's own hidden-states generator.
GENERATOR_REPLACED = (
    "speculators 0.5.0: extraction moved to vLLM's own extract_hidden_states (#353); our pipeline "
    "moves with it"
)
