"""``vllm.general_plugins`` entry point of speculators-compat: vLLM calls ``register()`` in every
process it starts, on every machine where the package is installed.

It lives outside the ``speculators_compat`` package on purpose: importing that package activates
the shims (its documented entry point), and vLLM imports an entry point's module in processes
that never asked for us. This module imports nothing of ours unless the process was started from
one that imported ``speculators_compat`` (which exports ``SPECULATORS_COMPAT_ACTIVE=1``, inherited
by its children, whatever their start method): only then are the shims activated here too. A
plain ``vllm serve`` next to the installed package is left alone.
"""

from __future__ import annotations

import os


def register() -> None:
    if os.environ.get("SPECULATORS_COMPAT_ACTIVE") == "1":
        from speculators_compat.registry import activate

        activate()
