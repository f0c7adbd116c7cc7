"""``doctor`` and ``preflight``: diagnosis before (and instead of) a long run."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import click

from ..diagnose.doctor import ABSENT, MATCHES, SHIMMED, STATES, UNCOVERED, diagnose
from ..diagnose.preflight import run_preflight
from ..pipeline.runner import environment_line
from ..versions import installed_versions
from .common import guard, quiet_logging


@click.command()
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


def register(main: click.Group) -> None:
    main.add_command(doctor)

    @main.command()
    @click.option(
        "--config",
        "config",
        type=click.Path(path_type=Path),
        required=True,
        help="A real model's config.json (no weights needed).",
    )
    @click.option(
        "--out",
        type=click.Path(path_type=Path),
        default=None,
        help="Keep the shrunken model's run here (default: a temporary folder).",
    )
    @click.option(
        "--samples", default=4, show_default=True, help="Conversations to extract (one training step)."
    )
    @guard
    def preflight(config, out, samples):
        """Shrink a real model's config to a random tiny model of the same architecture and class
        path, then run extraction and one training step through the code the real run uses.

        Prints what changed, what ran (with each step's real error if it failed) and the shims
        applied; exits 1 when a step failed."""
        quiet_logging(True)
        t0 = time.perf_counter()
        report = run_preflight(config, out=out, samples=samples)
        for warning in report.shrunk.warnings:
            click.secho(f"warning: {warning}", fg="yellow")
        click.echo(
            f"architecture {report.shrunk.recipe['architecture']}; shrunk: "
            + "; ".join(report.shrunk.changes)
        )
        for s in report.steps:
            mark = "ok    " if s.ok else "FAILED"
            click.echo(f"  {mark} {s.name:<17} {s.seconds:6.1f} s  {s.detail if s.ok else ''}")
            if not s.ok:
                click.echo("         " + s.detail.replace("\n", "\n         "))
        click.echo(f"  {environment_line(with_shims=False)}")
        click.echo(f"  shims applied: {', '.join(report.shims) or 'none'}")
        click.echo(f"{'OK' if report.ok else 'FAIL'}: preflight in {time.perf_counter() - t0:.1f} s")
        sys.exit(0 if report.ok else 1)
