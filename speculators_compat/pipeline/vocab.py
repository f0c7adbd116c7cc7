"""vocab: draft <-> target vocabulary mapping (d2t, t2d) through speculators 0.3.0."""

from __future__ import annotations

from dataclasses import dataclass

from .atomic import write_file
from .errors import PipelineError
from .layout import RunFolder
from .model_info import ModelInfo

#: speculators' usual draft vocabulary (Llama-3 drafts use 32000).
DEFAULT_DRAFT_VOCAB = 32000


@dataclass
class VocabResult:
    draft_vocab_size: int
    target_vocab_size: int
    distinct_tokens_seen: int


def build_vocab(run: RunFolder, info: ModelInfo, draft_vocab_size: int | None) -> VocabResult:
    import torch
    from speculators.train.vocab_mapping import build_vocab_mappings_from_distribution

    run.require_all_samples("vocab")  # the stages are in order: a later extraction resets vocab
    size = draft_vocab_size or min(DEFAULT_DRAFT_VOCAB, info.vocab_size)
    if not 0 < size <= info.vocab_size:
        raise PipelineError(
            f"--draft-vocab-size {size} must be between 1 and the target's vocabulary size {info.vocab_size}."
        )
    freq = torch.load(run.token_freq, weights_only=True)
    d2t, t2d = build_vocab_mappings_from_distribution(freq, size, info.vocab_size)
    for name, array in (("d2t", d2t), ("t2d", t2d)):
        write_file(run.vocab / f"{name}.npy", lambda tmp, a=array: _save_npy(tmp, a.cpu().numpy()))
    result = VocabResult(size, info.vocab_size, len(freq))
    run.mark_done("vocab", **vars(result))
    return result


def _save_npy(path, array) -> None:
    import numpy as np

    with open(path, "wb") as f:
        np.save(f, array)
