"""speculators_compat: run speculators 0.3.0's EAGLE-3 data generation on the installed vLLM."""

from __future__ import annotations

__version__ = "0.1.0.dev0"
