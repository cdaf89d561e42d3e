"""``turnout demo``: simulated engines for the reference workstation, and the gateway in front.

Each backend of the bundled ``demo.toml`` gets a simulator process on a free loopback port; the
gateway runs in this process on ``TURNOUT_PORT`` (8484). Ctrl-C or SIGTERM stops everything. The
demo records its traffic (``[record]``, for the what-if page) and writes its log under
:func:`demo_dir`.
"""

from __future__ import annotations

import fcntl
import itertools
import json
import os
import secrets
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from importlib import resources
from pathlib import Path
from typing import IO, Any

import httpx
import tomli_w
from pydantic import SecretStr

from gateway.serving import run_gateway
from gateway.settings import BackendConfig, Settings, load_settings

# Simulator options per demo backend (the engine facts of DOMAIN.md: vLLM prefill ~6600 tok/s and
# decode ~64 tok/s; llama.cpp ~3000 and ~109 tok/s for the 27B; the MoE decodes slower).
SIM_ARGS: dict[str, list[str]] = {
    "vllm": ["vllm", "--architecture", "hybrid", "--no-prefix-caching"],
    "llama-moe": [
        "llamacpp",
        "--architecture",
        "moe",
        "--slots",
        "2",
        "--prefill-tok-s",
        "900",
        "--decode-tok-s",
        "38",
    ],
    "llama-27b": ["llamacpp", "--architecture", "hybrid", "--slots", "2"],
}


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def demo_settings() -> Settings:
    text = resources.files("gateway").joinpath("demo.toml").read_text(encoding="utf-8")
    path = Path(os.environ.get("TMPDIR", "/tmp")) / f"turnout-demo-{os.getpid()}.toml"
    path.write_text(text, encoding="utf-8")
    try:
        return load_settings(path)
    finally:
        path.unlink(missing_ok=True)


def _sim_command(backend: BackendConfig, settings: Settings, port: int) -> list[str]:
    deployment = next(d for m in settings.models for d in m.deployments if d.backend == backend.id)
    args = [sys.executable, "-m", "gateway", "sim", *SIM_ARGS[backend.id], "--port", str(port)]
    args += ["--model", deployment.upstream_name, "--context-window", str(deployment.context_window)]
    return args


def _wait_ready(url: str, timeout: float = 60.0) -> None:  # a busy machine starts Python slowly
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if httpx.get(url + "/health", timeout=1.0).status_code < 500:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.1)
    raise RuntimeError(f"simulator at {url} did not start within {timeout:.0f} s")


def _exit_on_sigterm(signum: int, frame: object) -> None:
    raise SystemExit(128 + signum)


TRAFFIC_EVERY_S = 4.0
TRAFFIC_TURNS = 12


def _ask(client: httpx.Client, body: dict[str, Any], headers: dict[str, str], *, stream: bool) -> str:
    """One chat request, streamed or not; the answer's text."""
    if not stream:
        answer = client.post("/v1/chat/completions", json=body, headers=headers).json()
        return str(answer["choices"][0]["message"]["content"] or "")
    parts: list[str] = []
    with client.stream(
        "POST", "/v1/chat/completions", json={**body, "stream": True}, headers=headers
    ) as events:
        events.raise_for_status()
        for line in events.iter_lines():
            if line.startswith("data: {"):
                for choice in json.loads(line[6:]).get("choices", []):
                    parts.append(choice.get("delta", {}).get("content") or "")
    return "".join(parts)


def background_traffic(url: str, stop: threading.Event, every_s: float = TRAFFIC_EVERY_S) -> None:
    """A little traffic so the dashboard is alive on first open: two agents' conversations growing
    turn by turn on the 27B (each starts over after ``TRAFFIC_TURNS`` turns), and now and then a
    one-shot question to the MoE; a third of the requests streamed, the rest not (the dashboard's
    TTFT figures hold for both). Bounded: one request every ``every_s`` seconds, until ``stop``."""
    conversations: dict[str, list[dict[str, str]]] = {"demo-agent-1": [], "demo-agent-2": []}
    started = dict.fromkeys(conversations, 1)
    pastes = {  # each agent works on code of its own: two agents sending the same conversation
        # would share one slot's state, and every other turn would be an exact repeat
        "demo-agent-1": "def handler(request):\n    return route(request)\n" * 40,
        "demo-agent-2": "class Router:\n    def pick(self, backends):\n        return min(backends)\n" * 28,
    }
    with httpx.Client(base_url=url, timeout=60) as client:
        for tick in itertools.count():
            if stop.wait(every_s):
                return
            if tick % 5 == 4:
                question = [{"role": "user", "content": f"One question, number {tick}."}]
                body: dict[str, Any] = {"model": "qwen3.8-flash-next", "max_tokens": 32, "messages": question}
                headers: dict[str, str] = {}
            else:
                session = f"demo-agent-{tick % 2 + 1}"
                history = conversations[session]
                if len(history) >= 2 * TRAFFIC_TURNS:
                    history.clear()
                    started[session] += 1  # a new task: its first message is not the last one's
                turn = len(history) // 2 + 1
                task = f"Task {started[session]}, turn {turn}: review this."
                history.append({"role": "user", "content": f"{task}\n{pastes[session]}"})
                body = {"model": "qwen3.8-27b", "max_tokens": 48, "messages": history}
                headers = {"x-session-id": session}
            try:
                text = _ask(client, body, headers, stream=tick % 3 == 0)
            except (httpx.HTTPError, KeyError, IndexError, TypeError, ValueError):
                continue  # the gateway is starting or stopping: try again next tick
            if headers:
                conversations[headers["x-session-id"]].append({"role": "assistant", "content": text})


def demo_dir() -> Path:
    """Where the demo keeps its log and its recorded traffic: ``$TURNOUT_CACHE/demo`` (default
    ``~/.cache/turnout/demo``), created. Where that cannot be written (an image's user whose home is
    ``/nonexistent``), a folder of the user's own under the system's temporary directory, said on
    stderr: the demo runs either way."""
    cache = os.environ.get("TURNOUT_CACHE") or Path.home() / ".cache" / "turnout"
    folder = Path(cache) / "demo"
    try:
        folder.mkdir(parents=True, exist_ok=True)
        if os.access(folder, os.W_OK):
            return folder
        reason = "not writable"
    except OSError as exc:
        reason = exc.strerror or type(exc).__name__
    fallback = Path(tempfile.gettempdir()) / f"turnout-{os.getuid()}" / "demo"
    fallback.mkdir(parents=True, exist_ok=True)
    print(
        f"turnout demo: {folder} cannot be used ({reason}); logs and recorded traffic go to {fallback}"
        " (set TURNOUT_CACHE to choose)",
        file=sys.stderr,
        flush=True,
    )
    return fallback


def claim(folder: Path) -> tuple[Path, IO[str]]:
    """``folder``, or the first ``folder-N`` no other running demo holds (a lock held for the demo's
    life): two demos under one home used to share one traffic log, one rotating the other's
    recording. The lock's file stays open; closing it (the process ending) frees the folder."""
    for n in itertools.count(1):
        candidate = folder if n == 1 else folder.with_name(f"{folder.name}-{n}")
        candidate.mkdir(parents=True, exist_ok=True)
        lock = (candidate / ".lock").open("w")
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            lock.close()
            continue
        if candidate != folder:
            print(f"turnout demo: another demo uses {folder}; this one keeps its files in {candidate}",
                  file=sys.stderr, flush=True)  # fmt: skip
        return candidate, lock
    raise AssertionError("unreachable")


def write_config(settings: Settings, token: str, path: Path) -> None:
    """The demo's running configuration, its ports and admin token included, as a turnout config:
    ``turnout config check`` and ``turnout replay --backends`` read it."""
    data = settings.model_dump(mode="json", exclude_none=True)
    data["admin"]["token"] = token
    path.write_text(
        "# turnout demo's running configuration (its simulators' ports, its admin token)\n"
        + tomli_w.dumps(data),
        encoding="utf-8",
    )


def run_demo(traffic: bool = True, verbose: bool = False) -> int:
    """``verbose``: every log line on the terminal, as ``turnout serve`` prints them; else in
    ``demo_dir()/turnout.log``, with warnings on the terminal too, so the banner stays in sight."""
    signal.signal(signal.SIGTERM, _exit_on_sigterm)  # so `finally` stops the simulators
    base = demo_settings()
    ports = {b.id: _free_port() for b in base.backends}
    backends = [  # validated, not model_copy(update=...): its URL must be a URL, not a str
        BackendConfig.model_validate({**b.model_dump(), "url": f"http://127.0.0.1:{ports[b.id]}"})
        for b in base.backends
    ]
    token = base.admin.token.get_secret_value() if base.admin.token else secrets.token_urlsafe(12)
    admin = base.admin.model_copy(update={"token": SecretStr(token)})
    folder, lock = claim(demo_dir())
    record = (
        base.record if base.record.path else base.record.model_copy(update={"path": folder / "traffic.jsonl"})
    )
    log_file = None if verbose else folder / "turnout.log"
    settings = base.model_copy(update={"backends": tuple(backends), "admin": admin, "record": record})
    config = folder / "turnout.toml"
    write_config(settings, token, config)
    children: list[subprocess.Popen[bytes]] = []
    stop = threading.Event()
    try:
        for backend in settings.backends:
            children.append(subprocess.Popen(_sim_command(backend, settings, ports[backend.id])))
        for backend in settings.backends:
            _wait_ready(backend.base_url)
        url = f"http://{settings.host}:{settings.port}"
        print(
            f"\nturnout demo: gateway on {url}\n"
            + "".join(f"  {b.id:<10} ({b.kind.value}) simulator on {b.base_url}\n" for b in settings.backends)
            + "\nTry:\n"
            f"  curl -s {url}/v1/chat/completions -H 'content-type: application/json' \\\n"
            '    -d \'{"model": "qwen3.8-27b", "messages": [{"role": "user", "content": "Hello!"}]}\'\n'
            f"  curl -s {url}/v1/models\n\n"
            f"Dashboard: {url}/admin  (admin token: {token})\n"
            + ("A little background traffic keeps it alive (--no-traffic stops it).\n" if traffic else "")
            + f"Traffic is recorded to {record.path} for the what-if page and `turnout replay`.\n"
            + f"Its configuration, ports included: {config} (turnout config check {config})\n"
            + (
                f"Logs: {log_file} (warnings here too; --verbose prints every line here)\n"
                if log_file
                else ""
            )
            + "\nCtrl-C stops the gateway and the simulators.\n",
            flush=True,
        )
        if traffic:
            threading.Thread(target=background_traffic, args=(url, stop), daemon=True).start()
        run_gateway(settings, log_file)
        return 0
    finally:
        stop.set()
        for child in children:
            child.terminate()
        for child in children:
            try:
                child.wait(timeout=5)
            except subprocess.TimeoutExpired:
                child.kill()
        lock.close()  # the folder is free for the next demo
