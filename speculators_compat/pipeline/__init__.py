"""The pipeline: prepare -> extract -> vocab -> train, on speculators 0.3.0 with the shims.

Every stage reads and writes one run folder (see :mod:`.layout`); ``run`` chains them and skips
what is already complete, so re-running continues where a run stopped.
"""

from __future__ import annotations

from .errors import PipelineError

__all__ = ["PipelineError"]
