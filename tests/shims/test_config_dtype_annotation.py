"""config_dtype_annotation: ``import speculators`` under transformers 5."""

from __future__ import annotations

import os
import subprocess

import pytest

from speculators_compat.shims.config_dtype_annotation import SHIM
from tests.helpers import fresh

IMPORT = "import speculators_compat, speculators; print('imported', speculators_compat.status()[0].state)"


def _import(disable: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "SPECULATORS_COMPAT_DISABLE": disable}
    return fresh(["-c", IMPORT], env=env, timeout=300)


def test_speculators_imports_with_the_shim(state):
    proc = _import("")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert f"imported {state(SHIM)}" in proc.stdout


def test_without_it_transformers_5_breaks_the_import(state):
    import transformers

    if state(SHIM) != "applied":
        pytest.skip(f"transformers {transformers.__version__}: PretrainedConfig's annotations resolve")
    proc = _import(SHIM.name)
    assert proc.returncode != 0
    assert "PydanticUndefinedAnnotation: name 'torch' is not defined" in proc.stderr
