"""tox's inline plugin: the release envs, derived from speculators_compat/releases.py.

For each release X.Y it declares ``vllmX.Y`` (the whole suite; label ``matrix``) and
``ci-vllmX.Y`` (its CI tier), puts each release's CI env in the default env list, and gives every
env the settings tox.ini's ``[testenv]`` reads: ``vllm_release`` (X.Y), ``vllm_constraints``
(``constraints/vllm-X.Y.txt`` and, once ``tools/lock_envs.py`` wrote it, the lock file) and
``vllm_overrides``. Envs that run on a release without being one (``demo``, ``bench``) name it
with ``vllm_release`` in tox.ini.

With ``SPECULATORS_COMPAT_TOX_PRUNE=1`` (``.ci/run`` sets it) each release env is deleted once it
has run, and uv's cache drops what no later release pins at the same version
(``releases.last_use``): every release installs its own CUDA build of torch from PyPI (about 6 GB
with its ``nvidia-*`` libraries), and ``tox`` without it held them all at once (docs/testing.md has
the figures), more than a CI machine had free (``No space left on device`` at the fourth torch).
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess
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
PRUNE = "SPECULATORS_COMPAT_TOX_PRUNE"


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


def _uv() -> str:
    try:
        from uv import find_uv_bin  # tox-uv's own uv

        return find_uv_bin()
    except (ImportError, FileNotFoundError):
        return shutil.which("uv") or "uv"


@impl
def tox_env_teardown(tox_env):
    if os.environ.get(PRUNE) != "1":
        return
    try:
        release = releases.by_minor(tox_env.conf["vllm_release"])
    except KeyError:
        release = None
    if release is None:
        return
    env_dir = Path(tox_env.env_dir)
    free_before = shutil.disk_usage(env_dir.parent).free
    shutil.rmtree(env_dir, ignore_errors=True)
    packages = releases.last_use(release.minor)
    cleaned = subprocess.run(
        [_uv(), "cache", "clean", *packages], capture_output=True, text=True, check=False
    )
    free_after = shutil.disk_usage(env_dir.parent).free
    outcome = "" if cleaned.returncode == 0 else f" (uv cache clean failed: {cleaned.stderr.strip()[-300:]})"
    print(
        f"{tox_env.name}: {PRUNE}: env deleted, {len(packages)} packages no later release pins dropped from "
        f"uv's cache{outcome}; freed {(free_after - free_before) / 2**30:.1f} GiB, "
        f"{free_after / 2**30:.1f} GiB free",
        flush=True,
    )
