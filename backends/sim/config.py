"""The simulator's settings (one frozen dataclass; the CLI and tests build it)."""

from __future__ import annotations

import functools
from dataclasses import dataclass, field, replace
from typing import Literal

from backends.engine_profiles import load_profile
from policies.engine_profile import EngineProfile, linear_profile
from policies.types import Architecture

SimKind = Literal["vllm", "llamacpp"]

DEFAULT_PROFILES: dict[str, str] = {"vllm": "seed-5090-vllm-27b", "llamacpp": "seed-5090-llamacpp-27b"}
"""Each kind's engine profile when a config names none (``backends/profiles/``)."""
LLAMA_UBATCH = 512
"""llama-server's default ``--ubatch-size``: a llama.cpp simulator without a profile runs at it."""
DEFAULT_PREFILL_CHUNK = 2048
DENSE_BLOCK_SIZE = 16
DEFAULT_MAX_NUM_SEQS = 256
KV_POOL_FACTOR = 3
"""The simulated vLLM's KV pool holds ``KV_POOL_FACTOR * context_window`` tokens."""
DEFAULT_BLOCK_SIZE = 256
"""A hybrid model's block when neither the config nor the profile says one."""


@functools.cache
def default_profile(kind: SimKind) -> EngineProfile:
    """The built-in profile of ``kind`` (the seeds' single-5090 figures: 6600 / 64 tok/s for vLLM,
    3000 / 109 tok/s for llama.cpp)."""
    return load_profile(DEFAULT_PROFILES[kind])


@dataclass(frozen=True)
class SimConfig:
    """How one simulated engine behaves. Every field has a default.

    Speeds: an engine ``profile`` (``policies.engine_profile``) prices every step; without one, a
    linear profile of ``prefill_tok_s`` / ``decode_tok_s`` / ``batch_slowdown``, whose 0 means the
    kind's default profile's rate (``DEFAULT_PROFILES``: vLLM 6600 / 64 tok/s, llama.cpp 3000 / 109
    tok/s, from DOMAIN.md). With a profile, the rates are read from it (a profile wins over rates).
    Either way they are resolved at construction, so readers always see the effective value. Every
    simulated duration is multiplied by ``time_scale``.
    """

    kind: SimKind = "vllm"
    model: str = "sim-model"
    """Served name: vLLM ``--served-model-name``, llama.cpp ``--alias``."""
    context_window: int = 32768
    """vLLM ``max_model_len``; llama.cpp per-slot ``n_ctx``."""
    architecture: Architecture = Architecture.HYBRID
    slots: int = 2
    """llama.cpp ``-np`` (ignored by vLLM)."""
    max_num_seqs: int = 0
    """vLLM ``--max-num-seqs`` (ignored by llama.cpp); 0: ``DEFAULT_MAX_NUM_SEQS``, or fewer for a
    hybrid model whose KV pool holds fewer blocks. vLLM 0.25 gives each decoding sequence of a
    hybrid model one block of its pool for the recurrent state and refuses to start with more
    sequences than blocks (measured on the H100: "max_num_seqs (1024) exceeds available Mamba cache
    blocks (267)"); so does the simulator, for an explicit value."""
    prefix_caching: bool = True
    """vLLM only: hybrid -> block-aligned reuse when on, none when off; dense/moe -> 16-token blocks.
    A vLLM profile of a hybrid model that says ``prefix_caching = "off"`` (vLLM 0.24) turns it off."""
    block_size: int = 0
    """vLLM prefix-cache block for hybrid ``align`` mode; 0: the profile's ``prefix_block``, else
    ``DEFAULT_BLOCK_SIZE``."""
    prefill_tok_s: float = 0.0
    decode_tok_s: float = 0.0
    batch_slowdown: float = 0.06
    """Decode step time = (1 / decode_tok_s) * (1 + batch_slowdown * (n_running - 1))."""
    time_scale: float = 1.0
    api_key: str | None = None
    slot_save_path: str | None = None
    """llama.cpp ``--slot-save-path``: where ``POST /slots/N?action=save|restore`` write and read
    (``backends.sim.llama_slot_files``); unset: those actions are refused (501)."""
    enable_sleep_mode: bool = False
    """vLLM ``--enable-sleep-mode`` with ``VLLM_SERVER_DEV_MODE=1``: ``/sleep``, ``/wake_up``,
    ``/collective_rpc`` and ``/is_sleeping`` (``backends.sim.vllm_sleep``)."""
    load_seconds: float = 0.0
    """llama.cpp: every non-UI path answers 503 "Loading model" for this long after startup."""
    default_max_tokens: int | None = None
    """Cap on generated tokens when the request sets none (the natural answer is 16..48 tokens)."""
    enable_prompt_tokens_details: bool = True
    """vLLM ``--enable-prompt-tokens-details``."""
    seed: int = 0
    tool_calls: bool = True
    """The simulated model calls the first offered tool when the last message is the user's; off, it
    answers in text unless ``tool_choice`` names a tool (a coding agent's turn is then one request,
    and its compaction request gets the summary it asks for)."""
    reasoning_tokens: int = 0
    """A thinking model: this many reasoning tokens before each answer (llama.cpp streams them as
    ``reasoning_content``, vLLM 0.32 as ``reasoning``)."""
    prefill_chunk: int = field(default=0)
    """Prompt tokens processed per engine step (vLLM max_num_batched_tokens, llama.cpp n_batch); 0:
    the profile's ``batch`` (2048 without a profile)."""
    profile: EngineProfile | None = None
    """The engine profile the steps are priced by (None: linear, from the rates)."""
    cache_ram_mib: int = 8192
    """llama.cpp ``--cache-ram``: the RAM prompt cache in MiB (0 off, -1 no byte limit)."""
    cache_idle_slots: bool = True
    """llama.cpp ``--cache-idle-slots``: save every idle slot to the RAM cache when a task starts."""
    kv_unified: bool = False
    """llama.cpp ``--kv-unified`` (default only with ``-np`` auto): idle slots saved to RAM are cleared."""
    state_bytes_per_token: int = 64 * 1024
    """Bytes of a saved slot state per cached token (attention KV), for the RAM cache's size limit."""
    recurrent_state_bytes: int = 64 * 1024 * 1024
    """Bytes of one recurrent state (a hybrid slot's live state, and each context checkpoint)."""

    def __post_init__(self) -> None:
        if self.kind not in ("vllm", "llamacpp"):
            raise ValueError(f"unknown simulator kind {self.kind!r}")
        object.__setattr__(self, "architecture", Architecture(self.architecture))
        base = self.profile or default_profile(self.kind)
        if self.profile is not None or self.prefill_tok_s <= 0:
            object.__setattr__(self, "prefill_tok_s", base.prefill_tok_s())
        if self.profile is not None or self.decode_tok_s <= 0:
            object.__setattr__(self, "decode_tok_s", base.decode_tok_s())
        vllm_cache = self.profile.cache if self.profile is not None and self.kind == "vllm" else None
        if self.block_size <= 0:
            measured = vllm_cache.prefix_block if vllm_cache is not None else 0
            object.__setattr__(self, "block_size", measured or DEFAULT_BLOCK_SIZE)
        if (
            vllm_cache is not None
            and vllm_cache.prefix_caching == "off"
            and self.architecture is Architecture.HYBRID
        ):
            object.__setattr__(self, "prefix_caching", False)
        self._check_sequences()
        if self.prefill_chunk <= 0:
            chunk = self.profile.prefill.batch if self.profile is not None else DEFAULT_PREFILL_CHUNK
            object.__setattr__(self, "prefill_chunk", chunk)
        if self.slots < 1 or self.context_window < 1 or self.block_size < 1 or self.max_num_seqs < 1:
            raise ValueError("slots, context_window, block_size and max_num_seqs must be >= 1")
        if self.time_scale < 0:
            raise ValueError("time_scale must be >= 0")
        if self.cache_ram_mib < -1:
            raise ValueError("cache_ram_mib must be -1 (no limit), 0 (off) or a size in MiB")

    @functools.cached_property
    def engine_profile(self) -> EngineProfile:
        """The profile every step is priced by: ``profile``, or the linear one of the rates (llama.cpp
        at llama-server's default ``--ubatch-size``, 512: its first near-end checkpoint 516 tokens
        before a prompt's end, as the router assumes for a deployment without a profile)."""
        if self.profile is not None:
            return self.profile
        return linear_profile(
            self.kind,
            self.prefill_tok_s,
            self.decode_tok_s,
            batch_slowdown=self.batch_slowdown,
            batch=self.prefill_chunk,
            ubatch=min(LLAMA_UBATCH, self.prefill_chunk) if self.kind == "llamacpp" else None,
            name=f"{self.kind}-linear",
        )

    def _check_sequences(self) -> None:
        """``max_num_seqs`` resolved, and refused as vLLM refuses it (the field's docstring)."""
        blocks = self.kv_pool_tokens // max(self.cache_block_size, 1)
        hybrid = self.kind == "vllm" and self.architecture is Architecture.HYBRID
        if self.max_num_seqs == 0:
            limit = min(DEFAULT_MAX_NUM_SEQS, blocks) if hybrid else DEFAULT_MAX_NUM_SEQS
            object.__setattr__(self, "max_num_seqs", max(limit, 1))
        elif hybrid and self.max_num_seqs > blocks:
            raise ValueError(
                f"max_num_seqs ({self.max_num_seqs}) exceeds available Mamba cache blocks ({blocks}):"
                f" each decoding sequence of a hybrid model needs one; lower it to at most {blocks}"
            )

    @property
    def kv_pool_tokens(self) -> int:
        """Tokens the simulated vLLM's KV pool holds (``KV_POOL_FACTOR`` context windows)."""
        return KV_POOL_FACTOR * self.context_window

    @property
    def cache_block_size(self) -> int:
        """vLLM prefix-cache granularity: ``block_size`` for hybrids, 16 tokens otherwise."""
        return self.block_size if self.architecture is Architecture.HYBRID else DENSE_BLOCK_SIZE

    def with_kind(self, kind: SimKind) -> SimConfig:
        """A copy for another engine kind, with that kind's default speeds."""
        return replace(self, kind=kind, prefill_tok_s=0.0, decode_tok_s=0.0, profile=None)
