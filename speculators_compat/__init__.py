"""speculators_compat: run speculators 0.3.0's EAGLE-3 data generation on the installed vLLM.

Importing the package activates the shims: each is applied when the vLLM or speculators module
it patches is imported (or at once, if it already is), only where its probe finds the drift it
fixes. ``status()`` says what was applied and why; ``unpatch()`` restores the originals.
Set ``SPECULATORS_COMPAT_DISABLE=name,...`` (or ``all``) to leave shims out, and
``SPECULATORS_COMPAT_AUTO=0`` to import without activating.
"""

from __future__ import annotations

import os

from .registry import Status, activate, applied, apply_now, deactivate, status

__version__ = "0.1.0.dev0"

__all__ = ["Status", "activate", "applied", "apply_now", "status", "unpatch", "__version__"]


def unpatch() -> None:
    """Undo every applied shim and stop applying new ones (``activate()`` turns them back on)."""
    deactivate()


if os.environ.get("SPECULATORS_COMPAT_AUTO", "1") != "0":
    activate()
