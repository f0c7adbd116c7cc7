"""Diagnosis before and instead of a long run: ``doctor`` (which vLLM API points drifted and
which shim covers each) and ``preflight`` (the whole pipeline on a shrunken copy of the model).
Tooling: importing these modules patches nothing.
"""
