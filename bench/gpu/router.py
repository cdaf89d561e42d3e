"""llama-server's router mode: how long a model takes to load and unload, and what it holds meanwhile.

    python3 bench/gpu/router.py --server BIN --models-dir DIR --flags-file FLAGS --rounds 2 --out router.json

Starts ``BIN`` in router mode (``--models-dir DIR --models-max 1`` and the flags of ``FLAGS``, one
llama-server run's flags, less its ``--model`` and ``--alias``: the router passes them to each model's
instance) on ``--port``, then for each round and each model of the directory: ``POST /models/load``,
polls ``GET /models`` until it is ``loaded`` (the load time), sends one 8-token completion (the first
answer after the load), ``POST /models/unload`` and polls until it is ``unloaded`` (the unload time).
GPU memory (``nvidia-smi``, where there is one) is read after each step. Prints a line per step,
writes JSON.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import time
from pathlib import Path
from typing import IO, Any

import httpx

DROP = {"--model": 1, "--alias": 1, "--port": 1, "--host": 1}


def router_flags(flags: list[str]) -> list[str]:
    out, skip = [], 0
    for flag in flags:
        if skip:
            skip -= 1
        elif flag in DROP:
            skip = DROP[flag]
        else:
            out.append(flag)
    return out


def gpu_memory() -> str | None:
    if not shutil.which("nvidia-smi"):
        return None
    result = subprocess.run(
        ["nvidia-smi", "--query-gpu=memory.used", "--format=csv,noheader"],
        capture_output=True,
        text=True,
        check=False,
    )
    return result.stdout.strip() or None


def status(client: httpx.Client, model: str) -> str:
    for entry in client.get("/models").json()["data"]:
        if entry["id"] == model:
            value = entry["status"]
            return str(value["value"] if isinstance(value, dict) else value)
    raise KeyError(model)


def start_router(
    binary: str,
    models_dir: Path,
    flags: list[str],
    port: int,
    log: IO[bytes],
    *extra: str,
    limit_s: float = 60.0,
) -> subprocess.Popen[bytes]:
    """llama-server in router mode over ``models_dir`` (one model loaded at a time, none loaded by a
    request; ``flags`` and ``extra`` go to each instance) on 127.0.0.1:``port``, once its ``/health``
    answers 200 (RuntimeError, the process stopped, if it exits or is not up within ``limit_s``)."""
    command = [
        binary, "--models-dir", str(models_dir), "--models-max", "1", "--no-models-autoload", *extra, *flags,
        "--host", "127.0.0.1", "--port", str(port),
    ]  # fmt: skip
    print("router:", " ".join(command), flush=True)
    server = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT)
    deadline = time.monotonic() + limit_s
    while server.poll() is None and time.monotonic() < deadline:
        try:
            if httpx.get(f"http://127.0.0.1:{port}/health", timeout=2).status_code == 200:
                return server
        except httpx.TransportError:
            pass
        time.sleep(0.2)
    server.terminate()
    raise RuntimeError(f"the router did not start within {limit_s:g} s (see its log)")


def wait_for(client: httpx.Client, model: str, wanted: str, limit_s: float) -> float:
    started = time.perf_counter()
    while (now := time.perf_counter()) - started < limit_s:
        if status(client, model) == wanted:
            return now - started
        time.sleep(0.05)
    raise TimeoutError(f"{model} not {wanted} after {limit_s} s")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--server", required=True)
    parser.add_argument("--models-dir", required=True, type=Path)
    parser.add_argument("--flags-file", required=True, type=Path)
    parser.add_argument("--port", type=int, default=8090)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--limit", type=float, default=300.0, help="seconds a load or unload may take")
    parser.add_argument("--log", type=Path, default=Path("router.log"))
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    flags = router_flags(args.flags_file.read_text().split())
    rows: list[dict[str, Any]] = []
    with args.log.open("wb") as log:
        server = start_router(args.server, args.models_dir, flags, args.port, log)
        try:
            with httpx.Client(base_url=f"http://127.0.0.1:{args.port}", timeout=args.limit) as client:
                models = sorted(entry["id"] for entry in client.get("/models").json()["data"])
                print(f"router: {len(models)} model(s): {', '.join(models)}; idle GPU memory {gpu_memory()}")
                for round_ in range(args.rounds):
                    for model in models:
                        client.post("/models/load", json={"model": model}).raise_for_status()
                        load_s = wait_for(client, model, "loaded", args.limit)
                        loaded_memory = gpu_memory()
                        started = time.perf_counter()
                        body = {"model": model, "prompt": "hello", "max_tokens": 8, "ignore_eos": True}
                        client.post("/v1/completions", json=body).raise_for_status()
                        first_s = time.perf_counter() - started
                        client.post("/models/unload", json={"model": model}).raise_for_status()
                        unload_s = wait_for(client, model, "unloaded", args.limit)
                        row = {
                            "round": round_,
                            "model": model,
                            "load_s": load_s,
                            "first_answer_s": first_s,
                            "unload_s": unload_s,
                            "gpu_memory_loaded": loaded_memory,
                            "gpu_memory_unloaded": gpu_memory(),
                        }
                        rows.append(row)
                        print(
                            f"round {round_} {model}: load {load_s:.2f} s ({loaded_memory}), first answer "
                            f"{first_s:.2f} s, unload {unload_s:.2f} s ({row['gpu_memory_unloaded']})",
                            flush=True,
                        )
        finally:
            server.terminate()
            try:
                server.wait(30)
            except subprocess.TimeoutExpired:
                server.kill()
    if args.out:
        args.out.write_text(json.dumps(rows, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
