"""The simulated llama-server's slot files: ``POST /slots/{id}?action=save|restore|erase`` with
``{"filename": ...}`` under ``--slot-save-path`` (``SimConfig.slot_save_path``), as
``handle_slots_action`` in the pinned server-context.cpp does them.

A saved slot is its tokens (prompt and answer); a restore gives the slot those tokens back and no
checkpoints (the real restore clears the slot's prompt state and keeps only the tokens), so the next
turn reuses them only if it extends them. The file is written for real (JSON of the token ids, under
the save path), so a router-mode model unloaded and loaded again (``backends.sim.llama_router``) finds
it. A busy slot's action waits until the slot is idle (the real one is deferred).
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Annotated, Any, cast

import msgspec
from litestar import Request, Response, post
from litestar.params import PathParameter

from backends.sim import llama_wire
from backends.sim.http_common import json_response, read_json
from backends.sim.llama_engine import LlamaEngine

AnyRequest = Request[Any, Any, Any]
HEADER_BYTES = 124
"""What the real server writes for an empty slot (measured on the pinned build)."""


def _error(message: str, kind: str, code: int) -> Response[bytes]:
    return json_response(llama_wire.error_body(message, kind, code), code, "application/json; charset=utf-8")


def _valid(filename: str) -> bool:
    return bool(filename) and "/" not in filename and "\\" not in filename and filename not in (".", "..")


@post("/slots/{id_slot:int}", status_code=200)
async def slot_action(request: AnyRequest, id_slot: Annotated[int, PathParameter()]) -> Response[bytes]:
    """``?action=save|restore|erase`` of slot ``id_slot``."""
    engine = cast(LlamaEngine, request.app.state.sim)
    where = engine.config.slot_save_path
    if where is None:
        message = "This server does not support slots action. Start it with `--slot-save-path`"
        return _error(message, "not_supported_error", 501)
    action = request.query_params.get("action", "")
    try:
        body = await read_json(request)
    except msgspec.DecodeError:
        body = {}
    filename = str(body.get("filename", "")) if isinstance(body, dict) else ""
    if action in ("save", "restore") and not _valid(filename):
        return _error("Invalid filename", "invalid_request_error", 400)
    if action not in ("save", "restore", "erase"):
        return _error("Invalid action", "invalid_request_error", 400)
    slot = next((s for s in engine.slots if s.id == id_slot), None)
    if slot is None:
        return _error("Invalid slot ID", "invalid_request_error", 400)
    while slot.busy:  # noqa: ASYNC110 (deferred until the slot is idle: a slot has no event to await)
        await asyncio.sleep(0.005)
    bytes_per_token = engine.config.state_bytes_per_token
    if action == "erase":
        erased, slot.tokens, slot.checkpoints = len(slot.tokens), [], ()
        return json_response({"id_slot": id_slot, "n_erased": erased})
    path = Path(where) / filename
    if action == "save":
        path.write_bytes(msgspec.json.encode(slot.tokens))
        written = HEADER_BYTES + len(slot.tokens) * bytes_per_token
        timings = {"save_ms": 0.1}
        return json_response(
            {"id_slot": id_slot, "filename": filename, "n_saved": len(slot.tokens), "n_written": written,
             "timings": timings}
        )  # fmt: skip
    try:
        tokens = msgspec.json.decode(path.read_bytes(), type=list[int])
    except (OSError, msgspec.DecodeError):
        slot.tokens, slot.checkpoints = [], ()
        message = "Unable to restore slot: No available space in KV cache or invalid slot save file"
        return _error(message, "invalid_request_error", 400)
    slot.tokens, slot.checkpoints = tokens, ()
    read = HEADER_BYTES + len(tokens) * bytes_per_token
    return json_response(
        {"id_slot": id_slot, "filename": filename, "n_restored": len(tokens), "n_read": read,
         "timings": {"restore_ms": 0.1}}
    )  # fmt: skip
