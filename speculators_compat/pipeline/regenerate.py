"""prepare --regenerate: training samples whose answers are the verifier's own, from vLLM.

A draft learns to predict what its verifier says. Trained on someone else's answers, it sees
contexts the verifier would not produce; upstream EAGLE-3 recipes regenerate the responses with
the target model for that reason (self-distillation raises acceptance). Here the verifier, in
vLLM, answers every assistant turn of the data greedily, given the conversation up to that turn
formatted as speculators' preprocessing formats it (chat template text, then tokens without
added special tokens). Each answer becomes one sample: the prompt's tokens (loss mask 0), then
the answer exactly as the token ids the verifier produced (loss mask 1). The ids are kept, not
the decoded text: re-encoding a model's output can tokenize it differently (with the random
fixture verifiers, almost always), and the data would then no longer be what the verifier says.

The engine runs in a child process that does not import ``speculators_compat`` (see
:mod:`.serve`), as a plain vLLM user would run it; ``regenerated.jsonl`` keeps every sample
with its decoded answer.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from pathlib import Path

from .errors import PipelineError
from .model_info import inspect_model
from .serve import run_engine, text_only_limits

log = logging.getLogger("speculators_compat.pipeline")


@dataclass
class Regenerated:
    samples: list[dict]
    #: Assistant turns left out: the conversation before them leaves no room for an answer.
    skipped: int


def regenerate(
    conversations: list[list[dict]], *, model: Path, seq_length: int, max_tokens: int, dtype: str
) -> Regenerated:
    """The verifier's greedy answer (at most ``max_tokens``) at every assistant turn."""
    # speculators' own turn normalisation (from/value or role/content, human/gpt roles), so the
    # prompts are the conversations its preprocessing would format.
    from speculators.data_generation.preprocessing import _normalize_conversation

    chats = [_normalize_conversation(c) for c in conversations]
    if not any(m["role"] == "assistant" for c in chats for m in c):
        raise PipelineError("no assistant turn to regenerate: check the roles ('gpt'/'assistant').")
    if max_tokens >= seq_length:
        raise PipelineError(
            f"--regenerate {max_tokens} leaves no room for a prompt within --seq-length {seq_length}."
        )
    request = {
        "verifier": str(model),
        "dtype": dtype,
        "max_model_len": seq_length,
        "max_num_seqs": 256,
        "max_tokens": max_tokens,
        "trust_remote_code": True,
        "chats": chats,
    }
    if inspect_model(model).wrapper:
        request["limit_mm_per_prompt"] = text_only_limits()
    result = run_engine(request)
    if not result["samples"]:
        raise PipelineError(
            f"no assistant turn could be regenerated: every prompt is longer than --seq-length "
            f"{seq_length} minus --regenerate {max_tokens} tokens."
        )
    tokens = sum(len(s["answer_ids"]) for s in result["samples"])
    log.info(
        "regenerated %d assistant turns (%d tokens) with the verifier in vLLM",
        len(result["samples"]),
        tokens,
    )
    return Regenerated(result["samples"], result["skipped"])


def write_jsonl(samples: list[dict], path: Path) -> None:
    with path.open("w") as f:
        for s in samples:
            f.write(json.dumps(s) + "\n")


def as_columns(samples: list[dict]) -> dict[str, list]:
    """speculators' preprocessed columns: ``input_ids`` and ``loss_mask`` (1 on the answer)."""
    return {
        "input_ids": [s["prompt_ids"] + s["answer_ids"] for s in samples],
        "loss_mask": [[0] * len(s["prompt_ids"]) + [1] * len(s["answer_ids"]) for s in samples],
    }
