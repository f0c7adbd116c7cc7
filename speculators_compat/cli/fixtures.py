"""``fixtures``: the tiny checkpoints (random and trained) and the embedded chat and task data."""

from __future__ import annotations

from pathlib import Path

import click

from ..tiny import TASKS_DATA, build, chat, chat_dataset_path, list_recipes, load_recipe, tasks_dataset_path
from ..tiny import tasks as task_rows
from ..tiny.train import make_trained


@click.group()
def fixtures() -> None:
    """Tiny random checkpoints and the embedded chat dataset."""


@fixtures.command("list")
def fixtures_list() -> None:
    """List the recipes."""
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
    if tasks:
        rows = task_rows.make_conversations(
            count or TASKS_DATA["n"], TASKS_DATA["seed"] if seed is None else seed
        )
        click.echo(chat.write_jsonl(rows, out or tasks_dataset_path()))
    else:
        click.echo(
            chat.write_jsonl(chat.make_conversations(count or 300, seed or 0), out or chat_dataset_path())
        )


def register(main: click.Group) -> None:
    main.add_command(fixtures)
