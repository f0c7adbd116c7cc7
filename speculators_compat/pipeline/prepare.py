"""prepare: chat data -> token ids and loss masks, through speculators 0.3.0's preprocessing."""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from pathlib import Path

from .atomic import write_dir, write_file
from .errors import PipelineError
from .layout import RunFolder
from .model_info import ModelInfo
from .regenerate import as_columns, regenerate, write_jsonl
from .spec import RunSpec

log = logging.getLogger("speculators_compat.pipeline")


@dataclass
class PrepareResult:
    samples: int
    truncated: int
    without_assistant: int
    tokens: int
    #: Assistant turns rewritten by the verifier (``--regenerate``), else None.
    regenerated_turns: int | None = None


def first_bad_line(path: Path) -> str | None:
    """Where a .json/.jsonl file stops being what ``datasets`` reads: "line N (1-based), column C:
    what is wrong, and the line's start"; None if every line parses. Read only after ``datasets``
    failed (its own error names no line: "row 4" in a log line at most)."""

    def shown(line: str) -> str:
        line = line.rstrip("\n")
        return repr(line[:60] + ("..." if len(line) > 60 else ""))

    with path.open(encoding="utf-8", errors="replace") as f:
        lines = f.readlines()
    if path.suffix == ".json":
        try:
            json.loads("".join(lines))
        except json.JSONDecodeError as exc:
            return f"line {exc.lineno}, column {exc.colno}: {exc.msg}: {shown(lines[exc.lineno - 1])}"
        return None
    for n, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError as exc:
            return f"line {n}, column {exc.colno}: {exc.msg} (a cut or malformed record): {shown(line)}"
        if not isinstance(record, dict):
            return f"line {n}: a JSON {type(record).__name__}, not an object: {shown(line)}"
    return None


def load_conversations(data: str | Path, cache_dir: Path):
    """A local JSON/JSONL file or a ``datasets`` folder saved with ``save_to_disk``."""
    import datasets

    path = Path(data).expanduser()
    if not path.exists():
        raise PipelineError(
            f"dataset {path} does not exist: pass a local .json/.jsonl file or a datasets folder."
        )
    try:
        if path.is_dir():
            raw = datasets.load_from_disk(str(path))
            if isinstance(raw, datasets.DatasetDict):
                if "train" not in raw:
                    raise PipelineError(f"{path} holds splits {list(raw)}, none named 'train'.")
                raw = raw["train"]
        elif path.suffix in (".json", ".jsonl"):
            raw = datasets.load_dataset("json", data_files=str(path), split="train", cache_dir=str(cache_dir))
        else:
            raise PipelineError(f"{path}: expected a .json or .jsonl file, or a datasets folder.")
    except PipelineError:
        raise
    except Exception as exc:
        where = first_bad_line(path) if path.is_file() else None
        if where:
            raise PipelineError(
                f"cannot read the dataset {path}: {where}. Fix or remove that line (one JSON object "
                "a line, each with a 'conversations' list of {from/role, value/content} turns)."
            ) from None
        raise PipelineError(
            f"cannot read the dataset {path}: {type(exc).__name__}: {exc}. Expected ShareGPT-style "
            "records with a 'conversations' list of {from/role, value/content} turns."
        ) from None
    if "conversations" not in raw.column_names and "messages" in raw.column_names:
        raw = raw.rename_column("messages", "conversations")
    if "conversations" not in raw.column_names:
        raise PipelineError(
            f"{path} has no 'conversations' (or 'messages') column (columns: {raw.column_names}). "
            "Each record needs a list of {from/role, value/content} turns."
        )
    if len(raw) == 0:
        raise PipelineError(f"{path} holds no conversations: nothing to train on.")
    return raw


def prepare(run: RunFolder, spec: RunSpec, info: ModelInfo, *, num_proc: int = 1) -> PrepareResult:
    """``spec.data``'s conversations, shuffled with the run's seed, at most ``max_samples``,
    tokenized with the verifier's chat template (its answers regenerated first where the run
    asks for it) and cut to ``seq_length``."""
    import datasets
    from speculators.data_generation.preprocessing import build_eagle3_dataset
    from speculators.train.vocab_mapping import save_token_frequency_distribution
    from transformers import AutoTokenizer

    model, data, seq_length, max_samples = info.path, Path(spec.data), spec.seq_length, spec.max_samples
    regenerate_max_tokens = spec.regenerate
    raw = load_conversations(data, run.root / ".hf-cache").shuffle(seed=spec.seed)
    if max_samples is not None and len(raw) > max_samples:
        raw = raw.select(range(max_samples))
    tokenizer = AutoTokenizer.from_pretrained(str(model), trust_remote_code=True)
    if getattr(tokenizer, "chat_template", None) is None:
        raise PipelineError(
            f"the tokenizer of {model} has no chat template; speculators' preprocessing needs one "
            "to find the assistant turns. Use the chat (instruct) model's tokenizer files."
        )
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    regenerated = None
    if regenerate_max_tokens:
        result = regenerate(
            [row["conversations"] for row in raw],
            model=model,
            seq_length=seq_length,
            max_tokens=regenerate_max_tokens,
            dtype=spec.dtype or "auto",
        )
        if result.skipped:
            log.warning(
                "%d assistant turns left out: the conversation before them leaves no room for %d "
                "tokens within --seq-length %d",
                result.skipped,
                regenerate_max_tokens,
                seq_length,
            )
        write_file(run.regenerated, lambda tmp: write_jsonl(result.samples, tmp))
        regenerated = len(result.samples)
        built = datasets.Dataset.from_dict(as_columns(result.samples))
    else:
        # One token more than the limit, so that truncated sequences can be counted (speculators
        # truncates silently), then cut to the limit here.
        built = build_eagle3_dataset(raw, tokenizer, max_length=seq_length + 1, num_proc=num_proc)
    counts = {"truncated": 0, "without_assistant": 0, "tokens": 0}

    def cut(row):
        ids, mask = row["input_ids"], row["loss_mask"]
        if len(ids) > seq_length:
            counts["truncated"] += 1
            ids, mask = ids[:seq_length], mask[:seq_length]
        if int(sum(mask)) == 0:
            counts["without_assistant"] += 1
        counts["tokens"] += len(ids)
        return {"input_ids": ids, "loss_mask": mask}

    built.set_format(None)
    prepared = built.map(cut, load_from_cache_file=False, desc="Truncating to --seq-length")
    prepared.set_format(type="torch")
    if len(prepared) == 0:
        raise PipelineError(f"no conversation of {data} could be tokenized with {model}'s chat template.")
    if counts["without_assistant"] == len(prepared):
        raise PipelineError(
            f"none of the {len(prepared)} conversations in {data} has an assistant turn the chat "
            "template marks (every loss mask is 0): the draft would learn nothing. Check the roles "
            "('gpt'/'assistant') in the data."
        )
    if counts["truncated"]:
        log.warning(
            "%d of %d sequences were longer than %d tokens and were truncated",
            counts["truncated"],
            len(prepared),
            seq_length,
        )
    if counts["without_assistant"]:
        log.warning(
            "%d sequences have no assistant tokens (they add nothing to the loss)",
            counts["without_assistant"],
        )
    write_dir(run.prepared, lambda tmp: prepared.save_to_disk(str(tmp)))
    write_file(run.token_freq, lambda tmp: save_token_frequency_distribution(prepared, str(tmp)))
    result = PrepareResult(
        len(prepared), counts["truncated"], counts["without_assistant"], counts["tokens"], regenerated
    )
    run.mark_done("prepare", **vars(result))
    return result
