"""Refuse token ids the verifier cannot embed before vLLM does any work.

speculators 0.3.0's ``generate`` hands its token ids to vLLM unchecked (its requests bypass
vLLM's input processor, which would refuse them). An id at or past the model's vocabulary size
then reaches vLLM's vocab-parallel embedding: with tensor parallelism it is masked to a zero
embedding and that sequence's hidden states are garbage, silently, in training data; on one
rank the worker fails with ``IndexError: index out of range in self`` (naming no sequence), and
the generator is left unusable (the next call: "the vLLM scheduler scheduled nothing"). The
shim checks every sequence of the call first and raises ``ValueError`` naming each offending
sequence (its index in the call), position and id, and the vocabulary size; nothing is
scheduled, and the generator goes on working. (Empty sequences are refused by
``token_attribution``; sequences longer than ``max_model_len - 1`` are left to speculators,
which truncates them and returns the truncated ``input_ids`` with their states.)

Probe: speculators' ``generate`` does not compare the ids with the vocabulary size.
"""

from __future__ import annotations

import functools
import inspect

from ..shim import Shim, replace_attr
from ._targets import GENERATOR, module

NAME = "generate_input_check"
#: how many offending ids an error lists before summarising
SHOWN = 5


def probe() -> bool:
    source = inspect.getsource(module(GENERATOR).VllmHiddenStatesGenerator.generate)
    return "vocab" not in source


def problems(sequences, vocab_size: int) -> list[str]:
    """What is wrong with ``sequences`` (lists of ids) for a model of ``vocab_size`` ids."""
    found: list[str] = []
    for i, ids in enumerate(sequences):
        if len(ids) == 0 or (min(ids) >= 0 and max(ids) < vocab_size):
            continue
        found += [f"sequence {i}, position {p}: id {t}" for p, t in enumerate(ids) if not 0 <= t < vocab_size]
    return found


def check(sequences, vocab_size: int) -> None:
    found = problems(sequences, vocab_size)
    if found:
        more = f" (and {len(found) - SHOWN} more)" if len(found) > SHOWN else ""
        raise ValueError(
            f"token ids the verifier cannot embed (its vocabulary holds ids 0 to {vocab_size - 1}), "
            f"nothing was run: {'; '.join(found[:SHOWN])}{more}. Tokenize with the verifier's own "
            "tokenizer."
        )


def patch():
    cls = module(GENERATOR).VllmHiddenStatesGenerator
    original = cls.generate

    @functools.wraps(original)
    def generate(self, token_ids, *args, **kwargs):
        sequences = token_ids.tolist() if hasattr(token_ids, "tolist") else token_ids
        if sequences:  # (speculators itself refuses an empty batch)
            check(sequences, self.vllm_config.model_config.get_vocab_size())
        return original(self, token_ids, *args, **kwargs)

    return replace_attr(cls, "generate", generate, NAME)


SHIM = Shim(
    name=NAME,
    target=f"{GENERATOR}:VllmHiddenStatesGenerator.generate",
    vllm=">=0.11",
    symptom="an id past the vocabulary: with tensor parallelism no error, that sequence's states "
    "are garbage (a zero embedding); on one rank IndexError: index out of range in self (in a "
    "worker), and the generator's next call fails",
    upstream="none filed",
    remove_when="never on speculators 0.3.x (a diagnostic neither speculators nor vLLM gives)",
    hook_module=GENERATOR,
    probe=probe,
    patch=patch,
)
