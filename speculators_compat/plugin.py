"""``vllm.general_plugins`` entry point: vLLM calls it in every process it starts.

Worker processes (one per tensor-parallel rank, started by fork or spawn) must run the shims
too. A process started from one that imported ``speculators_compat`` inherits
``SPECULATORS_COMPAT_ACTIVE=1`` in its environment; only then does this plugin activate them,
so installing the package changes nothing for vLLM users who never import it.
"""

from __future__ import annotations

import os


def register() -> None:
    if os.environ.get("SPECULATORS_COMPAT_ACTIVE") == "1":
        from .registry import activate

        activate()
