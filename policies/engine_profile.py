"""Engine profiles: how long one engine takes to prefill, decode and restore, measured or derived.

An :class:`EngineProfile` is what ``turnout calibrate`` writes (TOML, ``backends.profiles`` reads and
writes it) and what every model of an engine's speed reads: the simulators and both replay clocks
(``backends.sim``), and the router's priors (``policies.cost`` and ``policies.learning``). Its
formulas are the engines' own mechanics, with coefficients fitted to the measured grid
(``policies.profile_fit``):

**Prefill** of ``new`` tokens after ``cached`` ones runs in engine steps of at most ``batch`` tokens
(llama.cpp ``--batch-size``, vLLM ``max_num_batched_tokens``), each computed in micro-batches of at most
``ubatch`` tokens (llama.cpp ``--ubatch-size``). A request pays ``request_s`` once; a micro-batch of
``u`` tokens at context position ``p`` costs::

    u * token_s  +  batch_s (if u >= batch_min)  +  u * (p + u / 2) / 1000 * context_s

``batch_s`` is a fixed cost per micro-batch: on llama.cpp with the experts in RAM (``--cpu-moe``) each
batch of 32 tokens or more first copies the experts it uses to the GPU (seconds per batch on PCIe),
smaller ones run the experts on the CPU. ``context_s`` is attention's share, which grows with the
context. With ``checkpoint_splits`` (llama-server serving a hybrid or SWA model with context
checkpoints) the last ``min(batch, 4 + ubatch)`` and the last 4 tokens of a prompt go in steps of
their own, so the server can checkpoint the recurrent state there (llama.cpp PR 20288), and a step
ends where the last user message starts (``user_start``): a warm chat turn re-processes the previous
answer and then the new user message, two micro-batches where one would do (docs/calibrate.md). Each
checkpoint it takes (``checkpoint_positions``, a cold prompt's first user message too) costs
``checkpoint_s``: a copy of the recurrent state off the GPU, which every slot waits for (on the H100's
27B, ~150 MiB in ~0.12 s: three of them are most of a short warm turn).

**Decode**: one step giving each of ``n`` sequences one token, with ``context`` tokens among them::

    step_s + (n - 1) * seq_s + context / 1000 * context_s

**Restores**: ``ram_restore_token_s`` per token a llama.cpp slot loads back from its RAM prompt cache
(``--cache-ram``); ``prefix_block`` the tokens a vLLM prefix-cache block holds (0: no reuse measured).

**vLLM's align mode**: a hybrid model on vLLM 0.25 with prefix caching (``prefix_caching = "on"`` and a
``prefix_block``) reuses prompts in whole blocks, and its scheduler cuts every prefill step to whole
blocks and at the prompt's last block boundary (``_mamba_block_aligned_split``), so that the recurrent
state is cached there: at 2,048 tokens a step and 1,568-token blocks a 4,000-token prompt runs in
steps of 1,568, 1,568 and 864. ``prefix_caching = "off"``: vLLM 0.24 and older (no hybrid reuse).

A profile of two rates (:func:`linear_profile`) is the two-constant model turnout used before.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Mapping, Sequence
from typing import Any, Literal

import msgspec

from policies.checkpoints import CHECKPOINT_TAIL, checkpoint_positions

SCHEMA_VERSION = 1
OFFLOAD_MIN_BATCH = 32
"""ggml offloads a CPU weight's op to the GPU only for batches of at least this many tokens."""

EngineName = Literal["vllm", "llamacpp"]


class ProfileSchemaError(ValueError):
    """A profile that does not follow the schema; the message names the field."""


class PrefillModel(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """Prompt processing (module docstring)."""

    token_s: float
    """Seconds per prompt token."""
    batch_s: float = 0.0
    """Fixed seconds per micro-batch of at least ``batch_min`` tokens."""
    batch_min: int = 1
    ubatch: int = 2048
    """Tokens per micro-batch (llama.cpp ``--ubatch-size``)."""
    batch: int = 2048
    """Tokens per engine step (llama.cpp ``--batch-size``, vLLM ``max_num_batched_tokens``)."""
    context_s: float = 0.0
    """Seconds per prompt token per 1,000 tokens before it (attention)."""
    checkpoint_splits: bool = False
    """llama-server's own cuts near a prompt's end (module docstring)."""
    request_s: float = 0.0
    """Fixed seconds per request with a prompt to process, before its first token (parsing, slot
    selection, saving idle slots to the RAM cache, the first sampling)."""
    checkpoint_s: float = 0.0
    """With ``checkpoint_splits``: seconds per context checkpoint taken processing a prompt (0: none)."""

    @property
    def checkpoint_gap(self) -> int:
        """How far before a prompt's end llama-server takes its first near-end context checkpoint:
        ``min(batch, 4 + ubatch)`` (``server-context.cpp``)."""
        return min(self.batch, CHECKPOINT_TAIL + self.ubatch)

    def __post_init__(self) -> None:
        _positive("prefill.request_s", self.request_s, allow_zero=True)
        _positive("prefill.checkpoint_s", self.checkpoint_s, allow_zero=True)
        _positive("prefill.token_s", self.token_s, allow_zero=True)
        _positive("prefill.batch_s", self.batch_s, allow_zero=True)
        _positive("prefill.context_s", self.context_s, allow_zero=True)
        if self.ubatch < 1 or self.batch < 1 or self.batch_min < 1:
            raise ProfileSchemaError("prefill.ubatch, prefill.batch and prefill.batch_min must be >= 1")
        if self.token_s == 0 and self.batch_s == 0:
            raise ProfileSchemaError("prefill.token_s or prefill.batch_s must be > 0")


class DecodeModel(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """Token generation (module docstring)."""

    step_s: float
    """Seconds of a step giving one sequence one token at an empty context."""
    seq_s: float = 0.0
    """Seconds added per further sequence in the step."""
    context_s: float = 0.0
    """Seconds added per 1,000 tokens of context, summed over the step's sequences."""

    def __post_init__(self) -> None:
        _positive("decode.step_s", self.step_s)
        _positive("decode.seq_s", self.seq_s, allow_zero=True)
        _positive("decode.context_s", self.context_s, allow_zero=True)


class CacheModel(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """What a reuse costs or gives."""

    ram_restore_token_s: float = 0.0
    """llama.cpp: seconds per token a slot loads back from the RAM prompt cache."""
    ram_save_s: float = 0.0
    """llama.cpp: seconds the server stops for to copy one slot's state into the RAM prompt cache,
    plus ``ram_save_token_s`` per token the slot holds: with ``--cache-idle-slots`` (its default)
    every idle slot whose state is not there yet is saved right after each task launch, and a slot
    taken for another prompt is saved before it loads (``server-context.cpp``); every slot, and the
    request just launched, waits (0: not measured)."""
    ram_save_token_s: float = 0.0
    """llama.cpp: seconds per token a slot holds that saving it adds (its attention KV)."""
    ram_save_checkpoint_s: float = 0.0
    """llama.cpp serving a hybrid model: seconds per context checkpoint the slot holds that saving it
    adds (each is a copy of the recurrent state; a conversation's slot holds one or two a turn)."""
    checkpoint_restore_s: float = 0.0
    """llama.cpp serving a hybrid model: seconds a slot takes to restore a context checkpoint (its
    recurrent state, copied back to the GPU) when a prompt diverges inside what the slot holds. It
    happens after the prompt's timer starts (in ``prompt_ms``), and every slot waits for it; a
    prompt that extends the slot's tokens uses the live state and pays nothing (0: not measured)."""
    prefix_block: int = 0
    """vLLM: tokens per prefix-cache block a hybrid model's prompt is reused in (0: none measured)."""
    prefix_caching: Literal["on", "off"] = "on"
    """vLLM serving a hybrid model: ``on``, reuse in whole ``prefix_block`` blocks and align its
    prefill steps to them (vLLM 0.25); ``off``, reuse nothing (vLLM 0.24 and older: module docstring)."""

    def __post_init__(self) -> None:
        if not math.isfinite(self.ram_restore_token_s) or self.ram_restore_token_s < 0:
            value = self.ram_restore_token_s
            raise ProfileSchemaError(f"cache.ram_restore_token_s must be >= 0, not {value!r}")
        for name in ("ram_save_s", "ram_save_token_s", "ram_save_checkpoint_s", "checkpoint_restore_s"):
            value = getattr(self, name)
            if not math.isfinite(value) or value < 0:
                raise ProfileSchemaError(f"cache.{name} must be >= 0, not {value!r}")
        if self.prefix_block < 0:
            raise ProfileSchemaError(f"cache.prefix_block must be >= 0, not {self.prefix_block!r}")

    def ram_save_seconds(self, tokens: int, checkpoints: int = 0) -> float:
        """Seconds llama-server stops for to save a slot holding ``tokens`` tokens and ``checkpoints``
        context checkpoints to its RAM cache."""
        if self.ram_save_s <= 0 and self.ram_save_token_s <= 0 and self.ram_save_checkpoint_s <= 0:
            return 0.0
        return self.ram_save_s + tokens * self.ram_save_token_s + checkpoints * self.ram_save_checkpoint_s


class Check(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """One measured scenario against a cold prefill of the same prompt (``turnout calibrate``)."""

    name: str
    """``warm`` (a turn appended on its slot), ``checkpoint`` (an edit inside the prompt), ``ram``
    (back from the RAM cache after an eviction), ``prefix`` (vLLM: the same prompt twice)."""
    prompt: int
    cached: int
    seconds: float
    cold_seconds: float
    predicted_s: float = 0.0
    """What the profile itself predicts for it (the fit's check)."""


class Point(msgspec.Struct, frozen=True, array_like=True):
    """A measured prefill (``new``, ``cached``, ``seconds``) or decode step (``batch``, ``context``,
    ``seconds``); TOML writes it as ``[a, b, seconds]``."""

    a: int
    b: int
    seconds: float


class EngineProfile(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """One engine serving one model on one machine (module docstring)."""

    name: str
    engine: EngineName
    prefill: PrefillModel
    decode: DecodeModel
    cache: CacheModel = CacheModel()
    schema: int = SCHEMA_VERSION
    model: str = ""
    description: str = ""
    source: str = ""
    """How it came to be: ``turnout calibrate ...`` with its date, or the arithmetic it was derived by."""
    context_window: int = 0
    """The longest prompt it was measured to (0: unknown)."""
    machine: tuple[tuple[str, str], ...] = ()
    """Free-form (key, text) pairs: the GPU, CPU, RAM and the engine's flags (TOML: a table)."""
    prefill_points: tuple[Point, ...] = ()
    decode_points: tuple[Point, ...] = ()
    checks: tuple[Check, ...] = ()
    notes: tuple[str, ...] = ()
    """What the calibration could not do, or did coarser than asked."""

    def __post_init__(self) -> None:
        if self.schema != SCHEMA_VERSION:
            raise ProfileSchemaError(
                f"profile schema {self.schema} is not supported (this turnout reads schema {SCHEMA_VERSION})"
            )

    # --- prefill ---------------------------------------------------------------------------------

    @property
    def align_block(self) -> int:
        """The block vLLM's align mode cuts prefill steps to (module docstring); 0: no such cuts."""
        cache = self.cache
        return cache.prefix_block if self.engine == "vllm" and cache.prefix_caching == "on" else 0

    def step_tokens(
        self, remaining: int, budget: int | None = None, *, prompt: int = 0, user_start: int = -1
    ) -> int:
        """Prompt tokens the next engine step takes of a prompt of ``prompt`` tokens with ``remaining``
        left to process, given ``budget`` tokens left in the step (default: the profile's ``batch``);
        ``user_start``: where the prompt's last user message starts (-1: none, or not a chat).
        0 when an aligned step has too little budget left for a whole block (the prompt waits)."""
        whole = budget is None
        take = min(remaining, self.prefill.batch if budget is None else budget)
        if self.prefill.checkpoint_splits and prompt >= remaining:
            done = prompt - remaining
            if done < user_start < done + take:  # the server ends the step at the last user message
                take = user_start - done
        if self.prefill.checkpoint_splits:
            for offset in (CHECKPOINT_TAIL + self.prefill.ubatch, CHECKPOINT_TAIL):
                tail = min(self.prefill.batch, offset)
                if remaining > tail >= remaining - take:
                    return remaining - tail
        block = self.align_block
        if block and prompt >= remaining:
            done = prompt - remaining
            last = prompt - prompt % block  # where the last whole block ends
            if done + take < last:
                aligned = take // block * block
                take = aligned if aligned or not whole else take  # a step smaller than a block: as is
            elif done < last < done + take:
                take = last - done
        return take

    def chunk_seconds(self, tokens: int, context: int = 0, *, first: bool = False) -> float:
        """Seconds to process ``tokens`` prompt tokens in one engine step, ``context`` tokens in
        (``first``: the request's first chunk, which also pays ``request_s``)."""
        fixed = self.prefill.request_s if first else 0.0
        return fixed + sum(self._ubatch_s(u, p) for u, p in _ubatches(tokens, context, self.prefill.ubatch))

    def prefill_seconds(
        self,
        new: int,
        cached: int = 0,
        user_start: int = -1,
        *,
        first_user: int = -1,
        checkpoints: bool = True,
    ) -> float:
        """Seconds to process ``new`` prompt tokens after ``cached`` reused ones (no other work), the
        request's fixed cost and (``checkpoints``: a prompt's, not a rest of one) its context
        checkpoints included (``user_start``: ``step_tokens``; ``first_user``: ``checkpoints_seconds``)."""
        steps = self.prefill_steps(new, cached, user_start)
        chunks = sum(self.chunk_seconds(n, p, first=p == cached) for n, p in steps)
        taken = self.checkpoints_seconds(new + cached, cached, user_start, first_user) if checkpoints else 0.0
        return chunks + taken

    def checkpoints_seconds(
        self, prompt: int, n_past: int, user_start: int = -1, first_user: int = -1
    ) -> float:
        """Seconds the context checkpoints cost that the server takes processing a prompt of ``prompt``
        tokens from ``n_past`` (``checkpoint_positions``: ``user_start`` and ``first_user`` where the
        last and the first user message start; ``checkpoint_s`` each; 0 without ``checkpoint_splits``)."""
        p = self.prefill
        if not p.checkpoint_splits or p.checkpoint_s <= 0:
            return 0.0
        at = checkpoint_positions(prompt, n_past, p.checkpoint_gap, user_start, first_user)
        return p.checkpoint_s * len(at)

    def prefill_steps(self, new: int, cached: int = 0, user_start: int = -1) -> Iterator[tuple[int, int]]:
        """The engine steps (tokens, context before them) a prompt's ``new`` tokens run in."""
        done = 0
        while done < new:
            take = self.step_tokens(new - done, prompt=new + cached, user_start=user_start)
            yield take, cached + done
            done += take

    def _ubatch_s(self, tokens: int, context: int) -> float:
        p = self.prefill
        fixed = p.batch_s if tokens >= p.batch_min else 0.0
        return tokens * p.token_s + fixed + tokens * (context + tokens / 2) / 1000 * p.context_s

    def prefill_tok_s(self, tokens: int = 4096) -> float:
        """The cold prefill rate at ``tokens`` tokens: the profile as one number (the router's prior)."""
        return tokens / self.prefill_seconds(tokens)

    # --- decode ----------------------------------------------------------------------------------

    def decode_step_seconds(self, sequences: int, context: int = 0) -> float:
        """Seconds of one decode step for ``sequences`` sequences holding ``context`` tokens in all."""
        if sequences <= 0:
            return 0.0
        d = self.decode
        return d.step_s + (sequences - 1) * d.seq_s + context / 1000 * d.context_s

    def decode_tok_s(self) -> float:
        """One sequence's decode rate at an empty context (the router's prior)."""
        return 1.0 / self.decode.step_s

    def batch_slowdown(self, sequences: int, context: int = 0) -> float:
        """How much longer a step is with ``sequences`` sequences than with one (>= 1)."""
        return self.decode_step_seconds(max(sequences, 1), context) / self.decode.step_s

    # --- restores --------------------------------------------------------------------------------

    def ram_restore_seconds(self, tokens: int) -> float:
        """Seconds to load ``tokens`` tokens of a saved slot back from the RAM cache."""
        return tokens * self.cache.ram_restore_token_s


def linear_profile(
    engine: EngineName,
    prefill_tok_s: float,
    decode_tok_s: float,
    *,
    batch_slowdown: float = 0.06,
    batch: int = 2048,
    ubatch: int | None = None,
    name: str = "",
) -> EngineProfile:
    """The two-constant model as a profile: prefill ``n / prefill_tok_s``, decode step ``(1 /
    decode_tok_s) * (1 + batch_slowdown * (n - 1))``; ``ubatch`` (default ``batch``) only places
    a llama.cpp slot's checkpoints (``PrefillModel.checkpoint_gap``)."""
    if prefill_tok_s <= 0 or decode_tok_s <= 0:
        raise ProfileSchemaError("prefill_tok_s and decode_tok_s must be > 0")
    return EngineProfile(
        name=name or f"{engine}-linear-{prefill_tok_s:g}-{decode_tok_s:g}",
        engine=engine,
        prefill=PrefillModel(token_s=1.0 / prefill_tok_s, ubatch=ubatch or batch, batch=batch),
        decode=DecodeModel(step_s=1.0 / decode_tok_s, seq_s=batch_slowdown / decode_tok_s),
        source=f"two rates: prefill {prefill_tok_s:g} tok/s, decode {decode_tok_s:g} tok/s",
    )


def profile_from_mapping(data: Mapping[str, Any]) -> EngineProfile:
    """A profile from its TOML/JSON mapping, validated; :class:`ProfileSchemaError` names the field."""
    schema = data.get("schema", SCHEMA_VERSION)
    if schema != SCHEMA_VERSION:
        raise ProfileSchemaError(
            f"profile schema {schema!r} is not supported (this turnout reads schema {SCHEMA_VERSION})"
        )
    machine = data.get("machine", {})
    if not isinstance(machine, Mapping):
        raise ProfileSchemaError("machine must be a table of strings")
    data = {**data, "machine": tuple((str(k), str(v)) for k, v in machine.items())}
    try:
        return msgspec.convert(data, EngineProfile, strict=False)
    except msgspec.ValidationError as exc:
        raise ProfileSchemaError(str(exc)) from exc


def profile_to_mapping(profile: EngineProfile) -> dict[str, Any]:
    """The profile as plain data (what TOML writes), fields in schema order."""
    data: dict[str, Any] = msgspec.to_builtins(profile)
    data["machine"] = dict(profile.machine)
    return data


def _ubatches(tokens: int, context: int, ubatch: int) -> Iterator[tuple[int, int]]:
    done = 0
    while done < tokens:
        u = min(ubatch, tokens - done)
        yield u, context + done
        done += u


def _positive(field: str, value: float, *, allow_zero: bool = False) -> None:
    if not math.isfinite(value) or value < 0 or (value == 0 and not allow_zero):
        raise ProfileSchemaError(f"{field} must be {'>= 0' if allow_zero else '> 0'}, not {value!r}")


def relative_errors(profile: EngineProfile) -> Sequence[float]:
    """``predicted / measured - 1`` for each prefill point, then each decode point."""
    out = [profile.prefill_seconds(p.a, p.b) / p.seconds - 1 for p in profile.prefill_points if p.seconds > 0]
    out += [
        profile.decode_step_seconds(p.a, p.b) / p.seconds - 1 for p in profile.decode_points if p.seconds > 0
    ]
    return out
