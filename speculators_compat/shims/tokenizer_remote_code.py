"""Checkpoints whose tokenizer is remote code (Kimi-K2.5) need ``trust_remote_code``.

speculators 0.3.0's generator loads the config and the vLLM model with
``trust_remote_code=True`` but the tokenizer (used for its EOS id) with plain
``AutoTokenizer.from_pretrained(model_path)``. Kimi-K2.5 ships its tokenizer as remote code, so
the generator fails before vLLM starts. The shim loads the tokenizer the way speculators already
loads everything else from that checkpoint: with ``trust_remote_code=True``. Checkpoints with a
built-in tokenizer load exactly as before.

Probe: speculators' ``__init__`` calls ``AutoTokenizer.from_pretrained`` without it.
"""

from __future__ import annotations

import inspect
import re

from ..shim import Shim, ShimProxy, replace_attr
from ._targets import GENERATOR, GENERATOR_REPLACED, module

NAME = "tokenizer_remote_code"


def probe() -> bool:
    source = inspect.getsource(module(GENERATOR).VllmHiddenStatesGenerator.__init__)
    calls = re.findall(r"AutoTokenizer\.from_pretrained\(([^)]*)\)", source)
    return any("trust_remote_code" not in args for args in calls)


class _AutoTokenizer(ShimProxy):
    def from_pretrained(self, *args, **kwargs):
        kwargs.setdefault("trust_remote_code", True)
        return self.__wrapped__.from_pretrained(*args, **kwargs)


def patch():
    gen = module(GENERATOR)
    return replace_attr(gen, "AutoTokenizer", _AutoTokenizer(gen.AutoTokenizer), NAME)


SHIM = Shim(
    name=NAME,
    target=f"{GENERATOR}:AutoTokenizer.from_pretrained",
    vllm=">=0.11",
    symptom="ValueError: The repository ... contains custom code which must be executed to correctly "
    "load the model ... Please pass the argument `trust_remote_code=True` to allow custom code to be run.",
    upstream="none found (speculators 0.4.0's generator still loads the tokenizer without trust_remote_code)",
    remove_when=GENERATOR_REPLACED,
    hook_module=GENERATOR,
    probe=probe,
    patch=patch,
)
