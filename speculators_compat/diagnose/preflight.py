"""preflight: a real model's ``config.json`` -> a shrunken random model of the same architecture
and class path -> extraction and one training step through the pipeline's own code.

The shrunken model keeps what decides which code runs (``architectures``, ``model_type``, the
multimodal wrapper and its ``text_config`` layout, MoE routing method and scoring, shared
experts, dense-first layers, rope scaling, MLA's LoRA layout) and cuts every size to the
shipped tiny recipe of the same family. Quantization is dropped (with a warning): the tiny
weights are random and full precision.
"""

from __future__ import annotations

import copy
import json
import logging
import tempfile
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path

from ..pipeline.errors import PipelineError
from ..pipeline.layout import RunFolder
from ..pipeline.runner import claim, run_stages
from ..pipeline.spec import RunOptions, RunRequest, TrainOptions
from ..registry import applied
from ..text_model import ignored_rope_interleave, is_wrapper, text_config
from ..tiny import build_recipe, chat_dataset_path, load_recipe

log = logging.getLogger("speculators_compat.diagnose.preflight")

#: Size keys cut to the tiny recipe's value (when the real config has them and they are set).
SIZE_KEYS = (
    "hidden_size",
    "intermediate_size",
    "moe_intermediate_size",
    "num_hidden_layers",
    "num_attention_heads",
    "num_key_value_heads",
    "head_dim",
    "n_shared_experts",
    "n_routed_experts",
    "num_experts_per_tok",
    "n_group",
    "topk_group",
    "first_k_dense_replace",
    "q_lora_rank",
    "kv_lora_rank",
    "qk_nope_head_dim",
    "qk_rope_head_dim",
    "v_head_dim",
    "num_nextn_predict_layers",
)
#: Keys the builder sets itself (from its tokenizer and dtype) or that describe the checkpoint.
DROPPED_KEYS = (
    "architectures",
    "model_type",
    "auto_map",
    "vocab_size",
    "bos_token_id",
    "eos_token_id",
    "pad_token_id",
    "torch_dtype",
    "dtype",
    "quantization_config",
    "transformers_version",
    "_name_or_path",
    "use_cache",
)
#: Text model types that transformers knows under another name (same architecture).
TRANSFORMERS_MODEL_TYPE = {"kimi_k2": "deepseek_v3"}
#: Tiny recipe per transformers model type (the sizes are cut to its values).
FAMILY = {"deepseek_v3": "deepseek-v3-tiny", "deepseek_v2": "deepseek-v3-tiny"}
WRAPPERS = {"KimiK25ForConditionalGeneration": "kimi-k25-tiny"}


@dataclass
class Shrunk:
    recipe: dict
    changes: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)


def shrink(config: dict, source: str = "config.json") -> Shrunk:
    """The tiny-builder recipe for ``config`` (a real ``config.json`` as a dict)."""
    architectures = config.get("architectures") or []
    if not architectures:
        raise PipelineError(f"{source} has no 'architectures': preflight needs the model class to build.")
    arch = architectures[0]
    wrapped = is_wrapper(config)
    if wrapped and arch not in WRAPPERS:
        raise PipelineError(
            f"{source}: {arch} wraps its text model in text_config; preflight builds the wrappers "
            f"{sorted(WRAPPERS)} so far."
        )
    text = copy.deepcopy(text_config(config))
    result = Shrunk(recipe={})
    holders = [("config.json", config)] + ([("text_config", text)] if wrapped else [])
    for where, holder in holders:
        q = holder.get("quantization_config")
        if isinstance(q, dict):
            method = q.get("quant_method", "?") + (f", {q['format']}" if "format" in q else "")
            result.warnings.append(
                f"quantization dropped ({where}: {method}): the shrunken model is random and full precision"
            )
    interleave = ignored_rope_interleave(config)
    if interleave:
        result.warnings.append(interleave)
    text_arch = (text.get("architectures") or [arch])[0] if wrapped else arch
    real_type = text.get("model_type", "")
    hf_type = TRANSFORMERS_MODEL_TYPE.get(real_type, real_type)
    family = load_recipe(FAMILY.get(hf_type, "llama-tiny"))
    tiny = family["config"]
    shrunk = {
        k: v
        for k, v in text.items()
        if k not in DROPPED_KEYS and not isinstance(v, dict) or k == "rope_scaling"
    }
    for key in SIZE_KEYS:
        if shrunk.get(key) is None or key not in tiny:
            continue
        if shrunk[key] != tiny[key]:
            result.changes.append(f"{key}: {shrunk[key]} -> {tiny[key]}")
            shrunk[key] = tiny[key]
    dtype = str(config.get("torch_dtype") or config.get("dtype") or text.get("torch_dtype") or "bfloat16")
    name = f"preflight-{arch}"
    base = {
        "name": name + ("-text" if wrapped else ""),
        "kind": "causal-lm",
        "architecture": text_arch,
        "dtypes": ["float32", "bfloat16"],
        "seed": 0,
        "tokenizer": family["tokenizer"],
        "config": {"model_type": hf_type, **shrunk},
    }
    if wrapped:
        shipped = load_recipe(WRAPPERS[arch])
        wrapper = {
            **shipped["wrapper"],
            "model_type": config.get("model_type", shipped["wrapper"]["model_type"]),
            "text_model_type": real_type or shipped["wrapper"]["text_model_type"],
        }
        result.changes.append("vision_config: the shipped tiny tower (never run: extraction is text-only)")
        result.recipe = {**shipped, "name": name, "base": base, "architecture": arch, "wrapper": wrapper}
    else:
        result.recipe = base
    result.recipe["dtypes"] = sorted({*result.recipe["dtypes"], dtype} & {"float32", "bfloat16", "float16"})
    result.recipe["preflight_dtype"] = dtype if dtype in ("float32", "bfloat16", "float16") else "bfloat16"
    return result


@dataclass
class StepResult:
    name: str
    ok: bool
    seconds: float
    detail: str


@dataclass
class Report:
    shrunk: Shrunk
    steps: list[StepResult]
    shims: list[str]
    model_dir: str | None

    @property
    def ok(self) -> bool:
        return all(s.ok for s in self.steps)


def run_preflight(config_path: str | Path, *, out: Path | None = None, samples: int = 4) -> Report:
    """Build the shrunken model and run prepare, extract, vocab and one training step."""
    path = Path(config_path).expanduser()
    try:
        config = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise PipelineError(f"cannot read {path}: {exc}. Pass the model's config.json.") from None
    shrunk = shrink(config, str(path))
    for warning in shrunk.warnings:
        log.warning(warning)
    steps: list[StepResult] = []
    model_dir = None

    def step(name, fn):
        t0 = time.perf_counter()
        try:
            detail = fn() or ""
            steps.append(StepResult(name, True, time.perf_counter() - t0, str(detail)))
            return True
        except Exception as exc:  # the real error is the report
            tail = "".join(traceback.format_exception(exc)[-3:]).strip()
            steps.append(StepResult(name, False, time.perf_counter() - t0, tail))
            return False

    def build():
        nonlocal model_dir
        model_dir = build_recipe(shrunk.recipe, shrunk.recipe["preflight_dtype"])
        return f"{shrunk.recipe['architecture']} ({shrunk.recipe['preflight_dtype']}) at {model_dir}"

    workdir = Path(out) if out else Path(tempfile.mkdtemp(prefix="speculators-compat-preflight-"))
    if step("build", build):
        run = RunFolder(workdir / "run")
        request = RunRequest.of(
            RunOptions(batch_size=samples, progress=False, train=TrainOptions(epochs=1, total_seq_len=2048)),
            model=model_dir,
            data=chat_dataset_path(),
            seq_length=512,
            max_samples=samples,
            draft_vocab_size=256,
        )
        claim(run, request, resume=False, overwrite=True)
        for stage in ("prepare", "extract", "vocab", "train"):
            label = "train (one step)" if stage == "train" else stage
            if not step(label, lambda s=stage: _facts(run_stages(run, request.options, (s,), force=True))):
                break
    return Report(shrunk, steps, applied(), str(model_dir) if model_dir else None)


def _facts(reports) -> str:
    facts = reports[-1].facts
    return ", ".join(f"{k}={v}" for k, v in facts.items() if k not in ("finished_at", "checkpoint"))
