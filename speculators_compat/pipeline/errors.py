"""Errors a user can act on."""

from __future__ import annotations


class PipelineError(Exception):
    """Bad input or state: the message says what is wrong and what to do. Nothing already
    written is removed when one is raised."""
