"""What the pipeline needs to know about a verifier checkpoint, read from its ``config.json``
without loading weights or remote code."""

from __future__ import annotations

import json
import logging
import re
from dataclasses import dataclass
from pathlib import Path

from ..text_model import is_wrapper, text_config
from .errors import PipelineError


@dataclass(frozen=True)
class ModelInfo:
    path: Path
    architectures: tuple[str, ...]
    model_type: str
    num_layers: int
    hidden_size: int
    vocab_size: int
    #: The weights sit in a multimodal wrapper (``text_config`` holds the language model).
    wrapper: bool

    def default_layer_ids(self) -> list[int]:
        """speculators 0.3.0's choice (three auxiliary layers and the last one) when its four ids
        are distinct; on models too shallow for that (it would pick a layer twice, and the
        generator returns each layer once) the last four layers."""
        n = self.num_layers
        ids = [2, n // 2, n - 3, n - 1]
        return ids if len(set(ids)) == 4 and ids == sorted(ids) else list(range(max(n - 4, 0), n))

    def check_layer_ids(self, layer_ids: list[int]) -> None:
        bad = [i for i in layer_ids if not 0 <= i < self.num_layers]
        if bad:
            raise PipelineError(
                f"layer ids {bad} are out of range: {self.path} has {self.num_layers} decoder layers "
                f"(valid ids 0..{self.num_layers - 1}). Pass --layer-ids with ids in that range, or "
                f"leave it out for speculators' default {self.default_layer_ids()}."
            )
        if len(layer_ids) != 4 or len(set(layer_ids)) != 4 or layer_ids != sorted(layer_ids):
            raise PipelineError(
                f"EAGLE-3 needs 4 distinct layer ids in ascending order (three auxiliary layers, then "
                f"the last layer; speculators' generator returns the layers in model order), got "
                f"{layer_ids}. Default for this model: {self.default_layer_ids()}."
            )


def inspect_model(path: str | Path) -> ModelInfo:
    folder = Path(path).expanduser()
    if not folder.exists():
        raise PipelineError(
            f"model path {folder} does not exist. Pass a local checkpoint folder (config.json, "
            "tokenizer, safetensors); download a Hugging Face model first, e.g. "
            "`huggingface-cli download ORG/NAME --local-dir DIR`."
        )
    config_file = folder / "config.json"
    if not config_file.is_file():
        raise PipelineError(f"{folder} has no config.json: pass the folder of a Hugging Face checkpoint.")
    try:
        raw = json.loads(config_file.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise PipelineError(f"cannot read {config_file}: {exc}. Fix or re-download the file.") from None
    if not isinstance(raw, dict):
        raise PipelineError(f"{config_file} is not a JSON object; re-download the checkpoint.")
    wrapper = is_wrapper(raw)
    source = text_config(raw)
    missing = [
        k for k in ("num_hidden_layers", "hidden_size", "vocab_size") if not isinstance(source.get(k), int)
    ]
    if missing:
        where = "text_config" if wrapper else "the top level"
        raise PipelineError(
            f"{config_file} has no {', '.join(missing)} at {where} (nor in text_config): the pipeline "
            "cannot tell how many decoder layers the model has. Use the model's original config.json."
        )
    return ModelInfo(
        path=folder.resolve(),
        architectures=tuple(raw.get("architectures") or ()),
        model_type=str(raw.get("model_type", "")),
        num_layers=source["num_hidden_layers"],
        hidden_size=source["hidden_size"],
        vocab_size=source["vocab_size"],
        wrapper=wrapper,
    )


def check_seq_length(info: ModelInfo, seq_length: int) -> None:
    """Refuse a ``--seq-length`` the verifier cannot take, before any stage runs. vLLM decides
    (its ``ModelConfig``, built as the generator will build it: the model's position limits, rope
    scaling, ``model_max_length``); without this the run prepares the data, then dies in vLLM
    with a pydantic ``ValidationError``. Other errors of that config are left to the stage that
    needs it, which reports them."""
    try:
        from vllm.config import ModelConfig
    except ImportError:
        return  # no vLLM here: prepare may still run; extract will say what is missing
    try:
        ModelConfig(model=str(info.path), max_model_len=seq_length, trust_remote_code=True)
    except Exception as exc:
        text = str(exc)
        if "max_model_len" not in text:
            logging.getLogger("speculators_compat.pipeline").debug("vLLM's ModelConfig: %s", text)
            return
        lines = [line.strip() for line in text.splitlines() if "max_model_len" in line]
        allowed = re.search(r"derived max_model_len \((\w+)=(\d+)", text)
        limit, most = (f" ({allowed[1]} = {allowed[2]})", allowed[2]) if allowed else ("", "N")
        raise PipelineError(
            f"--seq-length {seq_length} is longer than {info.path} takes{limit}. vLLM: {lines[0]} "
            f"Pass --seq-length {most} or less (nothing was run)."
        ) from None
