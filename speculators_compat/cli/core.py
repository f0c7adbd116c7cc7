"""``versions``, ``status`` and ``smoke``: what is installed, what the shims did, and vLLM's
hidden states on a tiny fixture against transformers."""

from __future__ import annotations

import sys

import click

from ..oracle.smoke import smoke as run_smoke
from ..registry import TESTED_VLLM_TEXT, apply_now, failure_report
from ..shim import markdown_table
from ..shims import SHIMS
from ..versions import installed_versions


@click.command()
def versions() -> None:
    """Print the installed vLLM, speculators, torch and transformers versions."""
    for name, value in installed_versions().as_dict().items():
        click.echo(f"{name:<13} {value or 'not installed'}")


@click.command()
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
        click.echo(markdown_table(SHIMS), nl=False)
        return

    rows = apply_now()
    v = installed_versions()
    click.echo(f"{v.line()} (tested vLLM releases: {TESTED_VLLM_TEXT})")
    width = max(len(r.shim.name) for r in rows)
    click.echo(f"{'shim':<{width}}  {'state':<10}  {'vLLM range':<14}  why")
    for r in rows:
        click.echo(f"{r.shim.name:<{width}}  {r.state:<10}  {r.shim.vllm:<14}  {r.reason}")
    failures = [r for r in rows if r.state == "failed"]
    if failures:
        click.secho(failure_report(failures), fg="red", err=True)
        sys.exit(1)


@click.command()
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
    try:
        ok = run_smoke(recipe, dtype, samples, generator, echo=click.echo)
    except ValueError as exc:  # an unknown recipe or dtype
        raise click.UsageError(str(exc)) from None
    sys.exit(0 if ok else 1)


def register(main: click.Group) -> None:
    for command in (versions, status, smoke):
        main.add_command(command)
