"""Live traffic written as a replayable trace (``[record]`` in the config; docs/replay.md).

Each inference request that an engine answered becomes one line of turnout's trace format
(``gateway.replay.traces``), so ``turnout replay`` reads the file as it reads a generated trace::

    {"t": 12.5, "session": "4a772dd931ba", "model": "qwen3.8", "input_tokens": 20480,
     "hash_ids": [0, 1, 2, ...], "max_tokens": 256}

``t`` is when the request arrived (its end less its duration), in seconds from the first recorded
request; ``session`` is the session's label (a hash, never the name a client sent) or null;
``input_tokens`` and ``max_tokens`` are the engine's own counts of the prompt and the answer (a replay
generates as much as was generated). ``hash_ids`` stand for the prompt's 512-token blocks without any
of its text: block ``i`` is named by the gateway's chained hash (``policies.prefix``) of the last whole
1 KiB chunk inside it, numbered in the order first seen, so two prompts that share their first blocks
share their first ids, and a conversation's next turn repeats the previous turn's ids. A block's size
in bytes is fixed per model by the first prompt recorded (its bytes per engine token), so the same
bytes always fall in the same block. The last (partial) block takes the digest of the whole prompt.

The file rotates by size: ``path`` becomes ``path.1`` (``path.1`` becomes ``path.2``, ...), keeping
``keep`` old files. Each recording (a start of the gateway, an admin's start) begins a new file, the
one before rotating away: a file has one clock and one numbering of blocks. Writing costs one short
line per request, only while recording.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import TextIO

from policies.decision import Outcome
from policies.prefix import CHUNK_BYTES, PromptChain
from policies.types import Awaited, RequestFeatures

BLOCK_TOKENS = 512
"""Tokens a ``hash_ids`` block stands for (the trace format's, Mooncake's)."""


class TrafficRecorder:
    """Appends each answered request to ``path`` as a trace line (module docstring)."""

    def __init__(self, path: Path, *, max_bytes: int = 64 << 20, keep: int = 3) -> None:
        self.path = Path(path)
        self.max_bytes = max_bytes
        self.keep = keep
        self._ids: dict[int, int] = {}
        self._block_bytes: dict[str, float] = {}  # per model: bytes a 512-token block spans
        self._start: float | None = None
        self._file: TextIO | None = None
        self._opened = False

    def record(self, features: RequestFeatures, outcome: Outcome, session: str | None, *, at: float) -> None:
        """One request that ended at ``at`` (epoch seconds) with ``outcome``."""
        arrived = at - outcome.duration_s
        if self._start is None:
            self._start = arrived
        tokens = outcome.usage.prompt_tokens or features.prompt_tokens
        line = {
            "t": round(max(arrived - self._start, 0.0), 6),
            "session": session,
            "model": features.model,
            "input_tokens": tokens,
            "hash_ids": self._block_ids(features.model, features.chain, tokens),
            "max_tokens": max(outcome.usage.completion_tokens or 0, 1),
        }
        if features.awaited is Awaited.LAST_TOKEN:  # an agent's call (policies.awaited)
            line["agent"] = True
        self._write(json.dumps(line, separators=(",", ":")) + "\n")

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None

    def _block_ids(self, model: str, chain: PromptChain, tokens: int) -> list[int]:
        if tokens <= 0 or chain.length == 0:
            return []
        size = self._block_bytes.setdefault(model, BLOCK_TOKENS * chain.length / tokens)
        ids = []
        for block in range(math.ceil(tokens / BLOCK_TOKENS)):
            end = min(round((block + 1) * size), chain.length)
            chunk = end // CHUNK_BYTES - 1
            partial = end >= chain.length or chunk < 0 or chunk >= chain.chunks
            ids.append(self._id(chain.whole if partial else chain.hashes[chunk]))
        return ids

    def _id(self, digest: int) -> int:
        return self._ids.setdefault(digest, len(self._ids))

    def _write(self, text: str) -> None:
        if self._file is None:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            if not self._opened and self.path.exists() and self.path.stat().st_size:
                self._rotate()  # another recorder's file: its clock and block ids are not this one's
            self._opened = True
            self._file = self.path.open("a", encoding="utf-8")
        self._file.write(text)
        self._file.flush()
        if self._file.tell() >= self.max_bytes:
            self._rotate()

    def _rotate(self) -> None:
        self.close()
        for index in range(self.keep, 0, -1):
            older = self.path.with_name(f"{self.path.name}.{index}")
            newer = self.path if index == 1 else self.path.with_name(f"{self.path.name}.{index - 1}")
            if index == self.keep and older.exists():
                older.unlink()
            if newer.exists():
                newer.rename(older)
        if self.keep == 0:
            self.path.unlink(missing_ok=True)
