"""The commands behind the CLI: settings into the run folder, stages in order, a summary."""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass

from .. import versions
from ..registry import TESTED_VLLM_TEXT, applied, apply_now, failed, failure_report, is_tested
from .errors import PipelineError
from .extract import extract
from .layout import STAGES, RunFolder
from .model_info import check_seq_length, inspect_model
from .prepare import prepare
from .spec import RunOptions, RunRequest, RunSpec, check_metric_loggers
from .train import train
from .vocab import build_vocab

log = logging.getLogger("speculators_compat.pipeline")


@dataclass
class StageReport:
    stage: str
    seconds: float
    skipped: bool
    facts: dict


def environment_line(with_shims: bool = True) -> str:
    line = versions.installed_versions().line()
    if with_shims:
        line += f"; shims applied so far: {', '.join(applied()) or 'none yet (they apply as modules load)'}"
    return line


def warn_if_untested() -> str | None:
    """A vLLM outside the tested range: say so (the shims' probes still decide)."""
    version = versions.installed_versions().vllm
    if version is None or is_tested(version):
        return None
    message = (
        f"vLLM {version} is outside the versions speculators_compat was tested on ({TESTED_VLLM_TEXT}); "
        "each shim's probe decides whether it applies (see `speculators-compat status`)"
    )
    log.warning(message)
    return message


def claim(run: RunFolder, request: RunRequest, *, resume: bool, overwrite: bool) -> None:
    """The folder holds the run ``request`` names (:meth:`RunFolder.claim`); a sequence length
    the verifier cannot take is refused before the folder is touched."""
    if request.model and not (resume and run.manifest.is_file()):
        check_seq_length(inspect_model(request.model), request.seq_length or RunSpec.seq_length)
    run.claim(request.identity, resume=resume, overwrite=overwrite)


def _stop_on_failed_shims() -> None:
    """Every shim resolved now (their modules imported), before any stage runs: one that failed
    leaves its drift unfixed, and for most that is silently wrong data (attribution, dtype,
    capture, the CPU kernels, training targets), so the run stops."""
    apply_now()
    failures = failed()
    if failures:
        raise PipelineError(failure_report(failures) + "\nNothing was run.")


def _samples_to_redo(run: RunFolder) -> bool:
    """A complete extraction whose sample files have since gone missing or been damaged, while
    training still needs them (not once the draft is trained): run it again (it extracts
    exactly those)."""
    if run.done("extract") is None or run.done("train") is not None:
        return False
    samples = run.require("prepare", "extract")["samples"]
    missing, damaged = run.missing_samples(samples), run.damaged_samples(samples)
    if missing or damaged:
        log.warning(
            "extract: complete, but %d sample files are missing and %d damaged since: extracting them again",
            len(missing),
            len(damaged),
        )
    return bool(missing or damaged)


def run_stages(
    run: RunFolder, options: RunOptions, stages: tuple[str, ...], *, force: bool = False
) -> list[StageReport]:
    """Run ``stages`` of the run ``run`` holds, in order; a stage already complete in this folder
    is skipped unless ``force`` (extraction still only computes the samples that are missing)."""
    spec = run.spec()
    warn_if_untested()
    info = inspect_model(spec.model)
    seq_length = spec.seq_length
    redo = "extract" in stages and not force and _samples_to_redo(run)
    pending = {stage for stage in stages if force or run.done(stage) is None} | (
        {"extract"} if redo else set()
    )
    if pending & {"prepare", "extract"}:
        check_seq_length(info, seq_length)  # vLLM's limit, before any stage runs
    if pending & {"extract", "train"}:
        _stop_on_failed_shims()
    if "train" in pending:
        check_metric_loggers(options.train.log_to)  # a missing package, before hours of extraction
    layer_ids = list(spec.layer_ids or info.default_layer_ids())
    reports = []
    for stage in STAGES:
        if stage not in stages:
            continue
        done = run.done(stage)
        if done is not None and not force and not (stage == "extract" and redo):
            log.info("%s: already complete in %s, skipped", stage, run.root)
            reports.append(StageReport(stage, 0.0, True, done))
            continue
        with run.writing(stage):
            done = run.done(stage)  # another process may have completed it meanwhile
            if done is not None and not force and not (stage == "extract" and redo):
                log.info("%s: completed meanwhile in %s, skipped", stage, run.root)
                reports.append(StageReport(stage, 0.0, True, done))
                continue
            log.info("%s: started (%s)", stage, environment_line())
            t0 = time.perf_counter()
            if stage == "prepare":
                if spec.data is None:
                    raise PipelineError("prepare needs --data (a .json/.jsonl file or a datasets folder)")
                result = prepare(run, spec, info, num_proc=options.num_proc)
            elif stage == "extract":
                result = extract(run, spec, info, options, layer_ids=layer_ids)
            elif stage == "vocab":
                result = build_vocab(run, info, spec.draft_vocab_size)
            else:
                result = train(run, spec, info, options.train, progress=options.progress)
            seconds = time.perf_counter() - t0
        facts = {k: v for k, v in vars(result).items() if k != "losses" and v is not None}
        reports.append(StageReport(stage, seconds, False, facts))
        log.info("%s: done in %.1f s", stage, seconds)
    return reports
