"""vLLM >= 0.17: ``Request(...)`` no longer takes ``eos_token_id``; it moved to the sampling params.

Probe: ``Request.__init__`` has no ``eos_token_id`` parameter. The shim drops the argument and
hands the id to ``SamplingParams.update_from_generation_config``, as vLLM's own input processor
does, so the request still stops at the tokenizer's EOS (speculators asks for one output token,
so this changes no hidden state; it keeps the request what speculators meant).
"""

from __future__ import annotations

from ..shim import Shim
from ._targets import GENERATOR, GENERATOR_REPLACED, accepts, module, rewrite_call

NAME = "request_eos_token_id"


def probe() -> bool:
    return not accepts(module(GENERATOR).Request.__init__, "eos_token_id")


def _move_eos(_args: tuple, kwargs: dict) -> None:
    if "eos_token_id" not in kwargs:
        return
    eos = kwargs.pop("eos_token_id")
    params = kwargs.get("sampling_params")
    if params is not None and eos is not None:
        params.update_from_generation_config({}, eos)


def patch():
    return rewrite_call("Request", NAME, _move_eos)


SHIM = Shim(
    name=NAME,
    target=f"{GENERATOR}:Request",
    vllm=">=0.17",
    symptom="TypeError: Request.__init__() got an unexpected keyword argument 'eos_token_id'",
    upstream="none found (speculators 0.4.0 still passes eos_token_id; it supports vLLM up to 0.16)",
    remove_when=GENERATOR_REPLACED,
    hook_module=GENERATOR,
    probe=probe,
    patch=patch,
)
