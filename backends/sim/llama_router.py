"""The simulated llama-server in router mode (``--models-dir`` / ``--models-preset``, ``--models-max``,
``--no-models-autoload``): one HTTP server over several models, each loaded into its own simulated
instance (the real one starts a child process per model) and requests routed by model, as
``server_models_routes`` in the pinned server-models.cpp does it:

* ``GET /models`` (and ``/v1/models``): every model with ``status.value`` ``unloaded``, ``loading``
  or ``loaded``; ``POST /models/load`` / ``/models/unload`` ``{"model": ...}`` (400 for a model already
  running or not running; loading an unknown one: 404 ``File Not Found``). A load takes ``load_s``
  and an unload ``unload_s`` (measured on the H100: Q8_0 of the 27B's shape 5.0-5.5 s and 0.26-0.31 s,
  docs/calibrate.md), times the instance's ``time_scale``. Loading past ``models_max`` unloads the
  least recently used.
* ``GET /health``: the router's own; ``GET /props`` without ``?model=``: the router's role.
* Every other path goes to the model's instance: a POST by its body's ``model``, a GET by
  ``?model=``; without one 400 ``model name is missing from the request``, an unknown one 400
  ``model '<name>' not found``, one not loaded (autoload off) 400 ``model is not loaded``.

Unloading drops the instance and everything it held (its slots, its RAM cache): only slot files
saved under ``--slot-save-path`` (``backends.sim.llama_slot_files``) survive, as on the real one.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Mapping, MutableMapping
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import parse_qs

import msgspec

from backends.sim.app import create_sim_app
from backends.sim.config import SimConfig
from backends.sim.llama_engine import LlamaEngine

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
LOAD_S = 5.2
UNLOAD_S = 0.3


@dataclass
class Instance:
    """One model of the router: its settings and, while loaded, its simulated server."""

    config: SimConfig
    status: str = "unloaded"
    app: Any = None
    used: float = 0.0
    failed: bool = False
    ready: asyncio.Event = field(default_factory=asyncio.Event)
    """Set while loaded (an autoloaded request waits on it)."""
    loading: asyncio.Task[None] | None = None


@dataclass
class RouterSim:
    """The router (module docstring): an ASGI app."""

    models: Mapping[str, SimConfig]
    models_max: int = 1
    autoload: bool = False
    load_s: float = LOAD_S
    unload_s: float = UNLOAD_S
    failing: frozenset[str] = frozenset()
    """Models whose instance exits while it loads (``status.failed``, ``exit_code`` 1), for tests."""
    instances: dict[str, Instance] = field(init=False)

    def __post_init__(self) -> None:
        self.instances = {name: Instance(config) for name, config in self.models.items()}
        self._tasks: set[asyncio.Task[None]] = set()

    # -- ASGI --------------------------------------------------------------------------------
    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            await self._lifespan(receive, send)
            return
        path, method = scope["path"], scope["method"]
        query = parse_qs(scope.get("query_string", b"").decode())
        if path == "/health":
            await _json(send, {"status": "ok"})
        elif path in ("/models", "/v1/models") and method == "GET":
            await _json(send, {"object": "list", "data": [self._entry(n) for n in self.instances]})
        elif path in ("/models/load", "/models/unload") and method == "POST":
            body = await _body(receive)
            await self._load_or_unload(send, path.endswith("load") and not path.endswith("unload"), body)
        elif path == "/props" and method == "GET" and "model" not in query:
            await _json(
                send, {"role": "router", "max_instances": self.models_max, "models_autoload": self.autoload}
            )
        elif method == "GET":
            await self._forward(scope, receive, send, (query.get("model") or [""])[0], b"")
        else:
            body = await _body(receive)
            try:
                decoded = msgspec.json.decode(body) if body else {}
            except msgspec.DecodeError:
                decoded = {}
            model = str(decoded.get("model", "")) if isinstance(decoded, dict) else ""
            await self._forward(scope, receive, send, model, body)

    async def _lifespan(self, receive: Receive, send: Send) -> None:
        while True:
            message = await receive()
            if message["type"] == "lifespan.startup":
                await send({"type": "lifespan.startup.complete"})
            elif message["type"] == "lifespan.shutdown":
                for task in list(self._tasks):
                    task.cancel()
                for name in list(self.instances):
                    await self._stop(name)
                await send({"type": "lifespan.shutdown.complete"})
                return

    # -- the models --------------------------------------------------------------------------
    def _entry(self, name: str) -> dict[str, Any]:
        instance = self.instances[name]
        status: dict[str, Any] = {"value": instance.status, "args": ["llama-server", "--alias", name]}
        if instance.failed:
            status |= {"failed": True, "exit_code": 1}
        return {
            "id": name,
            "aliases": [],
            "tags": [],
            "object": "model",
            "owned_by": "llamacpp",
            "status": status,
        }

    async def _load_or_unload(self, send: Send, load: bool, body: bytes) -> None:
        try:
            name = str(msgspec.json.decode(body).get("model", ""))
        except (msgspec.DecodeError, AttributeError):
            name = ""
        instance = self.instances.get(name)
        if instance is None:  # the real router's 404 goes out as its generic "File Not Found"
            if load:
                await _error(send, 404, "File Not Found", "not_found_error")
            else:
                await _error(send, 400, "model is not found", "invalid_request_error")
            return
        running = instance.status in ("loading", "loaded")
        if load and running:
            await _error(send, 400, "model is already running", "invalid_request_error")
            return
        if not load and not running:
            await _error(send, 400, "model is not running", "invalid_request_error")
            return
        if not load and instance.loading is not None:  # unloaded while it loads: the load stops there
            instance.loading.cancel()
        task = asyncio.create_task(self._load(name) if load else self._unload(name))
        if load:
            instance.loading = task
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        await _json(send, {"success": True})

    async def _load(self, name: str) -> None:
        loaded = [n for n, i in self.instances.items() if i.status in ("loading", "loaded") and n != name]
        while self.models_max and len(loaded) >= self.models_max:  # the least recently used goes first
            oldest = min(loaded, key=lambda n: self.instances[n].used)
            await self._unload(oldest)
            loaded.remove(oldest)
        instance = self.instances[name]
        instance.status, instance.failed = "loading", False
        try:
            await asyncio.sleep(self.load_s * instance.config.time_scale)
            if name in self.failing:  # the instance exited: the real router says so, and unloaded
                instance.status, instance.failed = "unloaded", True
                return
            instance.app = create_sim_app(instance.config)
            await _engine(instance).start()
            instance.status, instance.used = "loaded", time.monotonic()
            instance.ready.set()
        finally:
            instance.loading = None

    async def _unload(self, name: str) -> None:
        instance = self.instances[name]
        await asyncio.sleep(self.unload_s * instance.config.time_scale)
        await self._stop(name)

    async def _stop(self, name: str) -> None:
        instance = self.instances[name]
        if instance.app is not None:
            await _engine(instance).stop()
        instance.app, instance.status = None, "unloaded"
        instance.ready.clear()

    async def _forward(self, scope: Scope, receive: Receive, send: Send, name: str, body: bytes) -> None:
        if not name:
            await _error(send, 400, "model name is missing from the request", "invalid_request_error")
            return
        instance = self.instances.get(name)
        if instance is None:
            await _error(send, 400, f"model '{name}' not found", "invalid_request_error")
            return
        if instance.status != "loaded" and self.autoload:
            if instance.status == "unloaded":
                await self._load(name)
            await instance.ready.wait()
        if instance.status != "loaded" or instance.app is None:
            await _error(send, 400, "model is not loaded", "invalid_request_error")
            return
        instance.used = time.monotonic()
        sent = False

        async def replay() -> Message:
            nonlocal sent
            if not sent:
                sent = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await receive()

        await instance.app(scope, replay if scope["method"] != "GET" else receive, send)


def _engine(instance: Instance) -> LlamaEngine:
    engine: LlamaEngine = instance.app.state.sim
    return engine


async def _body(receive: Receive) -> bytes:
    chunks = []
    while True:
        message = await receive()
        chunks.append(message.get("body", b""))
        if not message.get("more_body"):
            return b"".join(chunks)


async def _json(send: Send, body: Any, status: int = 200) -> None:
    payload = msgspec.json.encode(body)
    headers = [
        (b"content-type", b"application/json; charset=utf-8"),
        (b"content-length", str(len(payload)).encode()),
    ]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": payload})


async def _error(send: Send, status: int, message: str, kind: str) -> None:
    await _json(send, {"error": {"code": status, "message": message, "type": kind}}, status)


def create_router_app(models: Mapping[str, SimConfig], **options: Any) -> RouterSim:
    """A router over ``models`` (name -> the instance's settings; each a llama.cpp ``SimConfig``)."""
    for name, config in models.items():
        if config.kind != "llamacpp":
            raise ValueError(f"{name}: router mode serves llama.cpp models, not {config.kind}")
    return RouterSim(models, **options)
