"""The ``speculators-compat`` command (also ``python -m speculators_compat``): one click group,
a module per group of commands, mounted here and nowhere else.

- :mod:`.core`: ``versions``, ``status``, ``smoke``
- :mod:`.fixtures`: ``fixtures list|build|train|chat``
- :mod:`.pipeline`: ``prepare``, ``extract``, ``vocab``, ``train``, ``run``, ``demo``, ``serve-check``
- :mod:`.diagnose`: ``doctor``, ``preflight``

Nothing in the package imports this one (tests/test_structure.py). The commands import the
pipeline, vLLM and torch inside their functions, on purpose: ``--help``, ``versions`` and
``status --markdown`` start without them.
"""

from __future__ import annotations

import click

from .. import __version__
from . import core, diagnose, fixtures, pipeline


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="speculators-compat")
def main() -> None:
    """Run speculators 0.3.0's EAGLE-3 pipeline (data generation and draft training) on the vLLM you have."""


for _group in (core, fixtures, pipeline, diagnose):
    _group.register(main)

if __name__ == "__main__":
    main()
