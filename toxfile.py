"""tox's inline plugin: the release envs, derived from speculators_compat/releases.py.

For each release X.Y it declares ``vllmX.Y`` (the whole suite; label ``matrix``) and
``ci-vllmX.Y`` (its CI tier), puts each release's CI env in the default env list, and gives every
env the settings tox.ini's ``[testenv]`` reads: ``vllm_release`` (X.Y), ``vllm_constraints``
(``constraints/vllm-X.Y.txt`` and, once ``tools/lock_envs.py`` wrote it, the lock file) and
``vllm_overrides``. Envs that run on a release without being one (``demo``, ``bench``) name it
with ``vllm_release`` in tox.ini.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

from tox.config.loader.memory import MemoryLoader
from tox.config.types import EnvList
from tox.plugin import impl

ROOT = Path(__file__).resolve().parent


def _load_releases():
    spec = importlib.util.spec_from_file_location(
        "_speculators_compat_releases", ROOT / "speculators_compat" / "releases.py"
    )
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses looks its module up there
    spec.loader.exec_module(module)
    return module


releases = _load_releases()
RELEASES = releases.RELEASES


@impl
def tox_extend_envs():
    return [name for release in RELEASES for name in dict.fromkeys((release.env, release.ci_env))]


@impl
def tox_add_core_config(core_conf, state):
    env_list = [release.ci_env for release in RELEASES] + ["lint"]
    core_conf.loaders.insert(0, MemoryLoader(env_list=EnvList(env_list)))


@impl
def tox_add_env_config(env_conf, state):
    name = env_conf.name
    release = releases.for_env(name)
    if release is not None and name == release.env:
        what = "the whole suite" if release.cpu_build else f"CI's {release.ci} tier (no engine: CUDA wheel)"
        described = MemoryLoader(labels=["matrix"], description=f"vLLM {release.minor}: {what}")
        env_conf.loaders.insert(0, described)
    elif release is not None:
        env_conf.loaders.insert(0, MemoryLoader(description=f"vLLM {release.minor}: CI's {release.ci} tier"))
    env_conf.add_config(
        keys=["vllm_release"],
        of_type=str,
        default=release.minor if release is not None else "",
        desc="the vLLM release this env installs (speculators_compat/releases.py)",
    )

    def constraints(conf, env_name):
        minor = conf.get_env(env_name)["vllm_release"]
        files = [ROOT / "constraints" / f"vllm-{minor}.txt"]
        lock = ROOT / "constraints" / "lock" / f"vllm-{minor}.txt"
        return " ".join(str(path) for path in files + ([lock] if lock.is_file() else []))

    def overrides(conf, env_name):
        chosen = releases.by_minor(conf.get_env(env_name)["vllm_release"])
        return str(ROOT / "constraints" / chosen.overrides) if chosen else ""

    env_conf.add_config(
        keys=["vllm_constraints"],
        of_type=str,
        default=constraints,
        desc="uv constraint files of the release (its pins, then its lock file)",
    )
    env_conf.add_config(
        keys=["vllm_overrides"], of_type=str, default=overrides, desc="uv override file of the release"
    )
