"""The commands behind the CLI: settings into the run folder, stages in order, a summary."""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from pathlib import Path

from .extract import WHOLE, Shard
from .layout import STAGES, RunFolder
from .model_info import check_seq_length, inspect_model
from .train import TrainOptions

log = logging.getLogger("speculators_compat.pipeline")


@dataclass
class RunSettings:
    model: str | None = None
    data: str | None = None
    seq_length: int = 2048
    max_samples: int | None = None
    seed: int = 0
    #: Regenerate the assistant turns with the verifier, at most this many tokens each (None: off).
    regenerate: int | None = None
    layer_ids: list[int] | None = None
    draft_vocab_size: int | None = None
    batch_size: int = 8
    tensor_parallel_size: int = 1
    dtype: str | None = None
    num_proc: int = 1
    #: extract only this shard (``extract --shard I/N``); None: every sample.
    shard: Shard | None = None
    train: TrainOptions = field(default_factory=TrainOptions)


@dataclass
class StageReport:
    stage: str
    seconds: float
    skipped: bool
    facts: dict


def environment_line(with_shims: bool = True) -> str:
    from ..registry import applied
    from ..versions import installed_versions

    line = installed_versions().line()
    if with_shims:
        line += f"; shims applied so far: {', '.join(applied()) or 'none yet (they apply as modules load)'}"
    return line


def warn_if_untested() -> str | None:
    """A vLLM outside the tested range: say so (the shims' probes still decide)."""
    from ..registry import TESTED_VLLM_TEXT, is_tested
    from ..versions import installed_versions

    version = installed_versions().vllm
    if version is None or is_tested(version):
        return None
    message = (
        f"vLLM {version} is outside the versions speculators_compat was tested on ({TESTED_VLLM_TEXT}); "
        "each shim's probe decides whether it applies (see `speculators-compat status`)"
    )
    log.warning(message)
    return message


def claim(run: RunFolder, s: RunSettings, *, resume: bool, overwrite: bool) -> dict:
    if s.model and not (resume and run.manifest.is_file()):
        check_seq_length(inspect_model(s.model), s.seq_length)  # before the folder is touched
    identity = {
        "model": str(Path(s.model).expanduser().resolve()) if s.model else None,
        "data": str(Path(s.data).expanduser().resolve()) if s.data else None,
        "seq_length": s.seq_length if s.model else None,
        "max_samples": s.max_samples,
        "seed": s.seed if s.model else None,
        "regenerate": s.regenerate,
        "layer_ids": s.layer_ids,
        "draft_vocab_size": s.draft_vocab_size,
    }
    return run.claim(identity, resume=resume, overwrite=overwrite)


def _stop_on_failed_shims() -> None:
    """Every shim resolved now (their modules imported), before any stage runs: one that failed
    leaves its drift unfixed, and for most that is silently wrong data (attribution, dtype,
    capture, the CPU kernels, training targets), so the run stops."""
    from ..registry import apply_now, failed, failure_report
    from .errors import PipelineError

    apply_now()
    failures = failed()
    if failures:
        raise PipelineError(failure_report(failures) + "\nNothing was run.")


def run_stages(
    run: RunFolder, s: RunSettings, stages: tuple[str, ...], *, force: bool = False, progress: bool = True
) -> list[StageReport]:
    """Run ``stages`` in order; a stage already complete in this folder is skipped unless
    ``force`` (extraction still only computes the samples that are missing)."""
    from .errors import PipelineError
    from .extract import extract
    from .prepare import prepare
    from .train import train
    from .vocab import build_vocab

    settings = run.settings()
    if "model" not in settings:
        raise PipelineError(
            f"{run.root} has no run yet: start with `speculators-compat prepare --model M --data D "
            f"--out {run.root}` (or `run`)."
        )
    warn_if_untested()
    info = inspect_model(settings["model"])
    seq_length = settings.get("seq_length", s.seq_length)
    pending = {stage for stage in stages if force or run.done(stage) is None}
    if pending & {"prepare", "extract"}:
        check_seq_length(info, seq_length)  # vLLM's limit, before any stage runs
    if pending & {"extract", "train"}:
        _stop_on_failed_shims()
    layer_ids = settings.get("layer_ids") or info.default_layer_ids()
    reports = []
    for stage in STAGES:
        if stage not in stages:
            continue
        done = run.done(stage)
        if done is not None and not force:
            log.info("%s: already complete in %s, skipped", stage, run.root)
            reports.append(StageReport(stage, 0.0, True, done))
            continue
        log.info("%s: started (%s)", stage, environment_line())
        t0 = time.perf_counter()
        if stage == "prepare":
            if "data" not in settings:
                raise PipelineError("prepare needs --data (a .json/.jsonl file or a datasets folder)")
            result = prepare(
                run,
                model=info.path,
                data=Path(settings["data"]),
                seq_length=seq_length,
                max_samples=settings.get("max_samples"),
                seed=settings.get("seed", 0),
                num_proc=s.num_proc,
                regenerate_max_tokens=settings.get("regenerate"),
                dtype=s.dtype,
            )
        elif stage == "extract":
            result = extract(
                run,
                info,
                layer_ids=layer_ids,
                seq_length=seq_length,
                batch_size=s.batch_size,
                tensor_parallel_size=s.tensor_parallel_size,
                dtype=s.dtype,
                progress=progress,
                shard=s.shard or WHOLE,
            )
        elif stage == "vocab":
            result = build_vocab(run, info, settings.get("draft_vocab_size"))
        else:
            result = train(run, info, s.train, progress=progress)
        seconds = time.perf_counter() - t0
        facts = {k: v for k, v in vars(result).items() if k != "losses" and v is not None}
        reports.append(StageReport(stage, seconds, False, facts))
        log.info("%s: done in %.1f s", stage, seconds)
    return reports
