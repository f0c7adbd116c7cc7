"""``prepare``, ``extract``, ``vocab``, ``train``, ``run``, ``demo`` and ``serve-check``: the
pipeline's commands (:mod:`speculators_compat.pipeline` does the work)."""

from __future__ import annotations

import dataclasses
import json
import os
import sys
import tempfile
import time
from pathlib import Path

import click

from .. import tiny
from ..pipeline.atomic import write_json
from ..pipeline.check import check_against_reference
from ..pipeline.errors import PipelineError
from ..pipeline.layout import STAGES, RunFolder
from ..pipeline.runner import StageReport, claim, environment_line, run_stages
from ..pipeline.serve import (
    cpu_spec_decode_text,
    cpu_spec_decode_unsupported,
    draft_with_aux_ids,
    latest_checkpoint,
    serve_check,
)
from ..pipeline.spec import (
    IDENTITY,
    METRIC_LOGGERS,
    PRECISIONS,
    RunOptions,
    RunRequest,
    Shard,
    TrainOptions,
    metric_logger_names,
)
from ..registry import applied
from .common import guard, quiet_logging

#: Tokens per regenerated assistant turn in the demo (its chat answers are 40-120 tokens).
DEMO_REGENERATE_TOKENS = 128
#: The demo's draft training (its 270 training conversations' short answers take 20 epochs to
#: learn: position-0 acceptance 0.38 after 2, 0.75 after 10, 0.88 after 20; docs/pipeline.md).
DEMO_EPOCHS = 20
#: ``demo --verifier``: the fixture recipe, and the function of :mod:`speculators_compat.tiny`
#: that gives its prompts.
DEMO_VERIFIERS = {
    "trained": ("deepseek-v3-tiny-trained", "tasks_dataset_path"),
    "random": ("deepseek-v3-tiny", "chat_dataset_path"),
}


def demo_request(
    verifier: str,
    model: Path | None = None,
    *,
    samples: int = 300,
    epochs: int = DEMO_EPOCHS,
    regenerate: bool = True,
    progress: bool = True,
) -> RunRequest:
    """The demo's run on ``verifier`` (a key of :data:`DEMO_VERIFIERS`) built at ``model``
    (tests derive their runs' flags from it)."""
    _, data = DEMO_VERIFIERS[verifier]
    return RunRequest.of(
        RunOptions(
            batch_size=32, progress=progress, train=TrainOptions(epochs=epochs, lr=1e-3, total_seq_len=1024)
        ),
        model=model,
        data=getattr(tiny, data)(),
        seq_length=512,
        max_samples=samples,
        regenerate=DEMO_REGENERATE_TOKENS if regenerate else None,
        dtype="float32",
        draft_vocab_size=256,
    )


def _layer_ids(_ctx, _param, value):
    if not value:
        return None
    try:
        return [int(v) for v in value.replace(",", " ").split()]
    except ValueError:
        raise click.BadParameter(f"{value!r}: give layer ids as integers, e.g. 2,30,58,60") from None


def _shard(_ctx, _param, value):
    if value is None:
        return None
    try:
        return Shard.parse(value)
    except ValueError as exc:
        raise click.BadParameter(str(exc).removeprefix("--log-to ")) from None


SHARD_OPTION = click.option(
    "--shard",
    callback=_shard,
    default=None,
    metavar="I/N",
    help="Extract only shard I of N (0 <= I < N): the samples whose index modulo N is I. Run the "
    "N shards at once on N machines (each its own vLLM engine) sharing the run folder; the last to "
    "finish completes the stage. Each resumes on its own; `vocab` and `train` refuse the run "
    "until every shard is done.",
)


def _common(stages: tuple[str, ...]):
    """Options of the stages in ``stages`` (the run folder options always)."""

    def decorate(f):
        opts = [
            click.option(
                "--out",
                "out",
                type=click.Path(path_type=Path),
                required=True,
                help="Run folder: every stage reads and writes here (run.json records the run).",
            ),
            click.option(
                "--resume",
                is_flag=True,
                help="The folder holds a different run: continue it with its own settings.",
            ),
            click.option(
                "--overwrite",
                is_flag=True,
                help="The folder holds a different run: delete its outputs, start this one.",
            ),
            click.option("--quiet", is_flag=True, help="No progress bars."),
        ]
        if "prepare" in stages:
            opts += [
                click.option(
                    "--model",
                    type=click.Path(path_type=Path),
                    help="Verifier checkpoint folder (config.json, tokenizer, safetensors).",
                ),
                click.option(
                    "--data",
                    type=click.Path(path_type=Path),
                    help="Chat data: .json/.jsonl (ShareGPT) or a datasets folder.",
                ),
                click.option(
                    "--seq-length",
                    default=2048,
                    show_default=True,
                    help="Longer sequences are truncated (and counted).",
                ),
                click.option(
                    "--max-samples", type=int, default=None, help="Use at most this many conversations."
                ),
                click.option("--seed", default=0, show_default=True, help="Shuffle seed."),
                click.option(
                    "--regenerate",
                    "regenerate",
                    type=int,
                    default=None,
                    metavar="MAX_TOKENS",
                    help="Train on the verifier's own answers: every assistant turn answered again "
                    "by the verifier in vLLM (greedy, at most MAX_TOKENS tokens), one sample per "
                    "turn, kept as the token ids it produced. Raises acceptance.",
                ),
                click.option("--num-proc", default=1, show_default=True, help="Processes for tokenization."),
            ]
        if "extract" in stages:
            opts += [
                click.option(
                    "--layer-ids",
                    callback=_layer_ids,
                    default=None,
                    help="Four layer ids, comma separated (three auxiliary, then the last). "
                    "Default: speculators' choice.",
                ),
                click.option(
                    "--batch-size",
                    default=8,
                    show_default=True,
                    help="Sequences per generator call (written to disk after each).",
                ),
                click.option("--tensor-parallel-size", default=1, show_default=True),
                click.option(
                    "--dtype",
                    type=click.Choice(["auto", "float32", "bfloat16", "float16"]),
                    default="auto",
                    show_default=True,
                    help="What the verifier runs in, extracting (and serving in serve-check): auto is "
                    "vLLM's choice for the checkpoint. The run keeps it; it may change until "
                    "extraction starts.",
                ),
            ]
        if "vocab" in stages:
            opts += [
                click.option(
                    "--draft-vocab-size",
                    type=int,
                    default=None,
                    help="Draft vocabulary (default: min(32000, target vocabulary)).",
                )
            ]
        if "train" in stages:
            opts += [
                click.option("--epochs", default=TrainOptions.epochs, show_default=True),
                click.option("--lr", default=TrainOptions.lr, show_default=True),
                click.option(
                    "--num-layers",
                    default=TrainOptions.num_layers,
                    show_default=True,
                    help="Draft decoder layers.",
                ),
                click.option("--ttt-steps", default=TrainOptions.ttt_steps, show_default=True),
                click.option(
                    "--total-seq-len",
                    default=TrainOptions.total_seq_len,
                    show_default=True,
                    help="Tokens per packed batch.",
                ),
                click.option(
                    "--num-workers",
                    type=int,
                    default=None,
                    help="Data loader workers. Default: 0 on a CPU (the step needs the cores), "
                    "up to 4 on a CUDA GPU (loading beside the step).",
                ),
                click.option(
                    "--precision",
                    type=click.Choice(PRECISIONS),
                    default=None,
                    help="What training computes in: fp32 (speculators as it ships), tf32 (float32 "
                    "with a CUDA GPU's TF32 matmuls) or bf16 (bfloat16 autocast, float32 weights "
                    "and optimizer). Default: tf32 on a CUDA GPU, fp32 on a CPU.",
                ),
                click.option(
                    "--log-to",
                    callback=_log_to,
                    default="",
                    metavar="LOGGERS",
                    help=f"Also send the training metrics to speculators' loggers, comma-separated: "
                    f"{', '.join(METRIC_LOGGERS)} (each needs its package: the extra of the same "
                    "name). Files go to RUN/logs/; train_metrics.jsonl is written either way.",
                ),
            ]
        for opt in reversed(opts):
            f = opt(f)
        return f

    return decorate


def _log_to(_ctx, _param, value: str) -> tuple[str, ...]:
    try:
        return metric_logger_names(value)
    except PipelineError as exc:
        raise click.BadParameter(str(exc).removeprefix("--log-to ")) from None


def _request(kw: dict, quiet: bool) -> RunRequest:
    """A stage command's options: the run's identity values it gives, and its knobs."""
    train = TrainOptions(**{f.name: kw[f.name] for f in dataclasses.fields(TrainOptions) if f.name in kw})
    knobs = {k: kw[k] for k in ("batch_size", "tensor_parallel_size", "num_proc", "shard") if kw.get(k)}
    options = RunOptions(**knobs, progress=not quiet, train=train)
    return RunRequest.of(options, **{k: kw[k] for k in IDENTITY if k in kw})


def _summary(run: RunFolder, reports: list[StageReport], total: float) -> None:
    if os.environ.get("RANK", "0") != "0":
        return  # under torchrun, rank 0 reports

    click.echo("")
    click.echo(f"run folder  {run.root}")
    for r in reports:
        how = "already complete" if r.skipped else f"{r.seconds:7.1f} s"
        shown = {k: v for k, v in r.facts.items() if k not in ("finished_at", "validation_samples")}
        click.echo(f"  {r.stage:<8} {how:>16}  " + ", ".join(f"{k}={v}" for k, v in shown.items()))
        if r.stage == "extract" and r.facts.get("missing"):
            click.echo(
                f"  {'':<8} {'':>16}  shard {r.facts.get('shard')} is complete; the stage completes "
                f"when the other shards' {r.facts['missing']} samples are on disk"
            )
    click.echo(
        f"  outputs: {run.prepared.name}/, {run.hidden_states.name}/ (data_config.json), "
        f"{run.vocab.name}/, {run.checkpoints.name}/, {run.metrics.name}"
    )
    click.echo(f"  {environment_line(with_shims=False)}")
    click.echo(f"  shims applied: {', '.join(applied()) or 'none'}")
    click.echo(f"  total {total:.1f} s")


def _stage_command(main, name: str, stages: tuple[str, ...], doc: str):
    """A command running ``stages``: one stage always (force), or the whole run (skipping what
    is complete)."""
    force = len(stages) == 1

    def command(out, resume, overwrite, quiet, **kw):
        quiet_logging(quiet)
        run = RunFolder(out)
        request = _request(kw, quiet)
        claim(run, request, resume=resume, overwrite=overwrite)
        t0 = time.perf_counter()
        reports = run_stages(run, request.options, stages, force=force)
        _summary(run, reports, time.perf_counter() - t0)

    command = guard(command)
    if stages == ("extract",):
        command = SHARD_OPTION(command)
    return main.command(name=name, help=doc)(_common(stages)(command))


def register(main: click.Group) -> None:
    _stage_command(
        main,
        "prepare",
        ("prepare",),
        "Chat data -> token ids and loss masks with the model's chat template (speculators' preprocessing).",
    )
    _stage_command(
        main,
        "extract",
        ("extract",),
        "Hidden states through speculators' generator with the shims, written as data_{i}.pt (resumable).",
    )
    _stage_command(main, "vocab", ("vocab",), "Draft <-> target vocabulary mapping (d2t.npy, t2d.npy).")
    _stage_command(
        main,
        "train",
        ("train",),
        "Train the EAGLE-3 draft with speculators' trainer (single process, or under torchrun).",
    )

    _stage_command(
        main, "run", STAGES, "prepare -> extract -> vocab -> train; re-running continues where it stopped."
    )

    @main.command()
    @click.option(
        "--out", type=click.Path(path_type=Path), default=Path("speculators-compat-demo"), show_default=True
    )
    @click.option(
        "--samples", default=300, show_default=True, help="Conversations of the embedded dataset to use."
    )
    @click.option("--epochs", default=DEMO_EPOCHS, show_default=True)
    @click.option(
        "--verifier",
        type=click.Choice(sorted(DEMO_VERIFIERS)),
        default="trained",
        show_default=True,
        help="trained: deepseek-v3-tiny-trained on the embedded task prompts (answers a draft can "
        "learn); random: the random deepseek-v3-tiny on the embedded chat data.",
    )
    @click.option(
        "--regenerate/--no-regenerate",
        default=True,
        show_default=True,
        help="Train on the verifier's own answers (prepare --regenerate 128) or on the dataset's.",
    )
    @click.option("--overwrite", is_flag=True, help="Start again in a folder that holds another run.")
    @click.option("--quiet", is_flag=True, help="No progress bars.")
    @guard
    def demo(out, samples, epochs, verifier, regenerate, overwrite, quiet):
        """All four stages on an embedded tiny DeepSeek-V3 model and its prompts (no network),
        then serve-check where the installed vLLM runs speculative decoding.

        The assistant turns are first rewritten by the verifier itself, so that what the draft
        learns is what the verifier will say when serving. Extraction runs in float32 so that the
        states can be checked against a transformers forward of the same model; the summary
        prints that check, the training loss and the served draft's acceptance."""
        recipe, _ = DEMO_VERIFIERS[verifier]

        quiet_logging(quiet)
        t0 = time.perf_counter()
        model = tiny.build(recipe, "float32")
        click.echo(f"fixture {recipe} (float32) at {model}  [{time.perf_counter() - t0:.1f}s]")
        run = RunFolder(out)
        request = demo_request(
            verifier, model, samples=samples, epochs=epochs, regenerate=regenerate, progress=not quiet
        )
        claim(run, request, resume=False, overwrite=overwrite)
        reports = run_stages(run, request.options, STAGES)
        _summary(run, reports, time.perf_counter() - t0)

        worst = check_against_reference(run, samples=3)
        from ..oracle.reference import tolerance

        # The trained verifier attends by position: the float32 bound of sharp weights holds.
        bound = tolerance("float32", sharp=verifier == "trained")
        click.echo(
            f"  states vs transformers (3 samples, all captured layers): worst relative error {worst:.1e} "
            f"(tolerance {bound:.0e})"
        )
        losses = [r.facts for r in reports if r.stage == "train"]
        if losses and losses[0].get("first_loss") is not None:
            click.echo(f"  training loss {losses[0]['first_loss']:.4f} -> {losses[0]['last_loss']:.4f}")
        if worst > bound:
            click.secho("FAIL: extracted states differ from the reference forward", fg="red")
            sys.exit(1)

        why_not = cpu_spec_decode_unsupported()
        if why_not:
            click.echo(f"  serve-check skipped: {why_not}")
            return
        if not _serve_check(run):
            sys.exit(1)
        _aux_ablation(run)

    _register_serve_check(main)

    @main.command()
    @click.option("--out", type=click.Path(path_type=Path), required=True, help="Run folder.")
    @guard
    def verify(out):
        """Check a run folder's sample files without loading them: every prepared sample's
        data_N.pt is there, of the size extraction wrote, and a whole torch file. Exits 1 naming
        what is missing or damaged (`extract` extracts exactly those again)."""
        run = RunFolder(out)
        samples = run.require("prepare", "verify")["samples"]
        missing, damaged = run.missing_samples(samples), run.damaged_samples(samples)
        click.echo(
            f"{run.hidden_states}: {samples} samples prepared, {samples - len(missing)} on disk, "
            f"{len(missing)} missing, {len(damaged)} damaged"
        )
        if missing:
            click.echo(f"  missing: {run.describe_missing(missing)}")
        for i, what in damaged.items():
            click.echo(f"  damaged: data_{i}.pt: {what}")
        if missing or damaged:
            click.echo(f"  run `speculators-compat extract --out {run.root}` to extract them again")
            sys.exit(1)


def _aux_ablation(run: RunFolder) -> None:
    """The served draft again, its aux layer ids one layer early (speculators' captured ids taken
    as vLLM's: the off-by-one of vLLM #43671): what acceptance loses."""
    right = json.loads(run.serve_report.read_text())["acceptance_per_position"][0]
    click.echo("ablation: the same draft with its aux layer ids one layer early (vLLM #43671's bug)...")
    with tempfile.TemporaryDirectory() as tmp:
        draft = draft_with_aux_ids(latest_checkpoint(run), Path(tmp) / "draft", run.captured_layer_ids()[:-1])
        shifted = serve_check(run, draft=draft, check_layer_ids=False)
    wrong = shifted.acceptance_per_position[0]
    click.echo(
        f"  position-0 acceptance {wrong:.3f} with ids {shifted.aux_layer_ids}, {right:.3f} with the "
        f"right ones: a drop of {right - wrong:.3f}"
    )


def _serve_check(run: RunFolder, **kw) -> bool:
    """serve-check on ``run``; prints the report, writes ``serve_check.json``; True if lossless."""
    click.echo("serve-check: the draft in vLLM's EAGLE-3 speculative decoding (two engines)...")
    t0 = time.perf_counter()
    report = serve_check(run, **kw)
    for line in report.lines():
        click.echo(f"  {line}")
    write_json(run.serve_report, dataclasses.asdict(report))
    click.echo(f"  serve-check {time.perf_counter() - t0:.1f} s; report in {run.serve_report}")
    if not report.lossless:
        click.secho(
            "FAIL: greedy outputs with the draft differ from those without it where the verifier "
            "was not tied (lines above: prompt, token, margin)",
            fg="red",
        )
    return report.lossless


def _register_serve_check(main: click.Group) -> None:
    def with_versions(f):  # the CPU builds that serve, in the help, from serve.CPU_SPEC_DECODE
        f.__doc__ = f.__doc__.replace("CPU_SPEC_DECODE", cpu_spec_decode_text())
        return f

    @main.command("serve-check")
    @click.option(
        "--out", type=click.Path(path_type=Path), required=True, help="Run folder with a trained draft."
    )
    @click.option(
        "--draft",
        type=click.Path(path_type=Path),
        default=None,
        help="Draft checkpoint folder (default: the run's latest checkpoints/<epoch>).",
    )
    @click.option(
        "--prompts", default=64, show_default=True, help="Held-out prompts (validation samples, at most)."
    )
    @click.option("--max-tokens", default=32, show_default=True, help="Greedy tokens per prompt.")
    @click.option(
        "--num-speculative-tokens", default=3, show_default=True, help="Draft tokens per verifier step."
    )
    @guard
    @with_versions
    def serve_check_command(out, draft, prompts, max_tokens, num_speculative_tokens):
        """Serve the run's draft next to its verifier in vLLM's own EAGLE-3 speculative decoding
        and measure it on held-out prompts.

        Prints vLLM's acceptance counters (rate, per position, mean accepted length), what
        speculators' own draft forward predicts for the same prompts, tokens/s with and without
        the draft, and whether greedy outputs are identical (they must be); writes
        serve_check.json in the run folder. Exits 1 if the outputs differ. Refuses a draft whose
        eagle_aux_hidden_state_layer_ids are not its training data's. Needs a vLLM that runs
        speculative decoding here (GPU, or a CPU build of CPU_SPEC_DECODE)."""
        quiet_logging(quiet=True)
        run = RunFolder(out)
        ok = _serve_check(
            run,
            draft=draft,
            prompts=prompts,
            max_tokens=max_tokens,
            num_speculative_tokens=num_speculative_tokens,
        )
        sys.exit(0 if ok else 1)
