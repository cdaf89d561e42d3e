"""What the gateway adds to a near-free upstream, beside nginx in the same run (issue #15).

    .venv/bin/python bench/overhead.py [--no-nginx] [--floor] [--before DIR] [--md-out FILE] [harness opts]

Runs the shared harness (``../shared/bench/overhead``, see its README: wrk, its stub on
127.0.0.1:9000, CPU pinning) against ``turnout serve`` with a config this script writes (one
``openai`` backend at the stub, model ``bench-model``, logs at warning), and against nginx as the
reference proxy, both started by the harness and pinned to CPU 1. Options it does not know are the
harness's (``--repeats 3 --duration 10`` by default; ``--skip-stream``, ``--nonstream-conc``...).
Needs ``wrk`` and ``nginx`` (Debian packages: ``apt-get install -y wrk nginx``).

``--before DIR`` adds an earlier turnout to the same run as ``turnout-before`` (a checkout, e.g.
``git worktree add /tmp/before <rev>``, run with this venv's packages on port 8485): before and after
measured side by side, on the same machine load.

``--floor`` adds ``bench/floor.py`` as ``floor``: a bare ASGI relay on uvicorn and aiohttp, the
stack turnout is built on with nothing of turnout's, so what the stack costs and what turnout adds
to it are told apart in one run; and as ``floor-litestar`` the same relay as one litestar handler
(the framework turnout is built on, nothing of turnout's).
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
HARNESS = REPO.parent / "shared" / "bench" / "overhead"
PORT = 8484
BEFORE_PORT = 8485
FLOOR_PORT = 8486
LITESTAR_FLOOR_PORT = 8487
TEMPLATE = """\
log_level = "warning"
port = {port}

[admin]
token = "overhead-bench"

[[backends]]
id = "stub"
kind = "openai"
url = "http://127.0.0.1:9000"
probe_interval_s = 2.0

[[models]]
name = "bench-model"
[[models.deployments]]
backend = "stub"
upstream_name = "bench-model"
"""
CONFIG = TEMPLATE.format(port=PORT)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--no-nginx", action="store_true", help="measure turnout (and direct) only")
    parser.add_argument("--before", type=Path, default=None, help="an earlier turnout checkout to compare")
    parser.add_argument(
        "--floor", action="store_true", help="add bench/floor.py: uvicorn + aiohttp alone, no gateway"
    )
    args, harness_args = parser.parse_known_args(argv)
    for tool in ("wrk", *(() if args.no_nginx else ("nginx",))):
        if shutil.which(tool) is None:
            print(f"{tool} not found: apt-get install -y wrk nginx", file=sys.stderr)
            return 2
    with tempfile.TemporaryDirectory(prefix="turnout-overhead-") as directory:
        config = Path(directory) / "turnout.toml"
        config.write_text(CONFIG, encoding="utf-8")
        turnout = REPO / ".venv" / "bin" / "turnout"
        command = [
            "--target", f"turnout=http://127.0.0.1:{PORT}/v1",
            "--start", f"turnout={turnout} serve --config {config}",
        ]  # fmt: skip
        if args.before is not None:
            before = Path(directory) / "before.toml"
            before.write_text(TEMPLATE.format(port=BEFORE_PORT), encoding="utf-8")
            python, checkout = REPO / ".venv" / "bin" / "python", args.before.resolve()
            command += [
                "--target", f"turnout-before=http://127.0.0.1:{BEFORE_PORT}/v1",
                "--start", f"turnout-before=env -C {checkout} PYTHONPATH={checkout} {python} -m gateway serve"
                f" --config {before}",  # -C: ``-m`` puts the working directory first on the path
            ]  # fmt: skip
        if args.floor:
            python = REPO / ".venv" / "bin" / "python"
            command += [
                "--target", f"floor=http://127.0.0.1:{FLOOR_PORT}/v1",
                "--start", f"floor={python} {REPO / 'bench' / 'floor.py'} --port {FLOOR_PORT}",
                "--target", f"floor-litestar=http://127.0.0.1:{LITESTAR_FLOOR_PORT}/v1",
                "--start", f"floor-litestar={python} {REPO / 'bench' / 'floor.py'} --litestar"
                f" --port {LITESTAR_FLOOR_PORT}",
            ]  # fmt: skip
        if not args.no_nginx:
            prefix = Path(directory) / "nginx"
            (prefix / "logs").mkdir(parents=True)
            nginx = f"nginx -p {prefix}/ -c {HARNESS / 'nginx.conf'}"
            command += ["--target", "nginx=http://127.0.0.1:8081/v1", "--start", f"nginx={nginx}"]
        return subprocess.call(["bash", str(HARNESS / "run.sh"), *command, *harness_args])


if __name__ == "__main__":
    sys.exit(main())
