"""Simulated llama-server: ``-np`` slots, an unbounded deferred FIFO, per-slot prefix reuse, RAM cache.

A submitted task picks a slot (``llama_slots.select_slot``); if none is idle, or its pinned slot is
busy, it is deferred. When the choice says so, the slot's state is saved to the RAM prompt cache and
the best cached state for the prompt is loaded into it (``ram_cache``); after a launch, every idle
slot is saved there too (``--cache-idle-slots``); each save stops the server for the profile's
``ram_save_seconds`` of the slot's tokens (added to its next step), and so does restoring a context
checkpoint (``cache.checkpoint_restore_s``, inside the request's ``prompt_ms``: the server restores it
once the prompt's timer started). Starting on a slot: a prompt
longer than the slot's ``n_ctx`` fails with ``exceed_context_size_error`` and releases the slot at
once; otherwise
``prefix_cache.llama_reuse`` decides ``cache_n`` and the prompt's checkpoints are recorded. On
release the slot keeps the prompt plus the generated tokens except the last sampled one (it was
never decoded), stamps ``t_last_used`` and retries one deferred task (``llama_slots.pick_deferred``).
Metrics follow ``server_task_result_metrics::to_metrics``.
"""

from __future__ import annotations

from collections import deque

from backends.clock import WALL, Clock
from backends.sim.config import SimConfig
from backends.sim.engine_base import BatchEngine
from backends.sim.events import EventKind
from backends.sim.llama_slots import Slot, pick_deferred, select_slot
from backends.sim.prefix_cache import add_checkpoints, llama_reuse
from backends.sim.ram_cache import RamCache, StateSizes
from backends.sim.task import SimError, SimTask, Update, UpdateKind
from policies.types import Architecture


def context_error(n_prompt: int, n_ctx: int) -> SimError:
    """The 400 ``exceed_context_size_error`` a slot sends for a prompt longer than its context."""
    message = (
        f"request ({n_prompt} tokens) exceeds the available context size ({n_ctx} tokens), try increasing it"
    )
    body = {
        "error": {
            "code": 400,
            "message": message,
            "type": "exceed_context_size_error",
            "n_prompt_tokens": n_prompt,
            "n_ctx": n_ctx,
        }
    }
    return SimError(400, body)


class LlamaEngine(BatchEngine):
    """The llama-server slot scheduler (see the module docstring)."""

    def __init__(self, config: SimConfig, *, clock: Clock = WALL) -> None:
        super().__init__(config, clock=clock)
        self.slots = [Slot(i, config.context_window) for i in range(config.slots)]
        self.deferred: deque[SimTask] = deque()
        self.hybrid = config.architecture is Architecture.HYBRID
        # where it ends a step near a prompt's end: min(n_batch, 4 + n_ubatch), n_batch the steps' size
        self.checkpoint_gap = min(config.prefill_chunk, self.perf.profile.prefill.checkpoint_gap)
        sizes = StateSizes(config.state_bytes_per_token, config.recurrent_state_bytes if self.hybrid else 0)
        self.ram_cache = RamCache.for_flag(config.cache_ram_mib, config.context_window * config.slots, sizes)
        self.started_at = clock.monotonic()
        self.process_start = clock.time()
        self._use_counter = 0
        self.n_prompt_processed = 0
        self.n_prompt_cached = 0
        self.prompt_seconds = 0.0
        self.n_predicted = 0
        self.predict_seconds = 0.0
        self.n_tokens_max = 0
        self.bucket = [0, 0.0, 0, 0.0]  # prompt n, prompt s, predicted n, predicted s since last scrape

    @property
    def is_loading(self) -> bool:
        """True during the first ``load_seconds * time_scale`` seconds on the engine's clock."""
        return self.clock.monotonic() - self.started_at < self.config.load_seconds * self.config.time_scale

    def submit(self, task: SimTask) -> None:
        """Give ``task`` a slot now or defer it."""
        choice = select_slot(self.slots, task.prompt, task.id_slot)
        slot = choice.slot
        if slot is None or slot.busy:
            self.deferred.append(task)
            return
        stalled = self.stall_s
        if choice.update_cache and self.ram_cache is not None:
            self._save(self.ram_cache, slot)
            entry = self.ram_cache.load(slot.tokens, task.prompt)
            if entry is not None:
                slot.tokens, slot.checkpoints = entry.tokens, entry.checkpoints
        before = self.stall_s
        launched = self._launch(slot, task)
        restore = self.stall_s - before  # in its prompt_ms, as its checkpoints: once the prompt started
        if launched and self.ram_cache is not None and self.config.cache_idle_slots:
            self._save_idle_slots(self.ram_cache)
        task.sim_start += self.stall_s - stalled - restore  # its prompt starts after the saves (prompt_ms)

    def _save(self, cache: RamCache, slot: Slot) -> None:
        """Save ``slot``'s state to the RAM cache; the server stops for it (``ram_save_seconds``)."""
        if cache.save(slot.tokens, slot.checkpoints):
            self.stall_s += self.perf.profile.cache.ram_save_seconds(len(slot.tokens), len(slot.checkpoints))

    def _save_idle_slots(self, cache: RamCache) -> None:
        for slot in self.slots:
            if not slot.busy:
                self._save(cache, slot)
                if self.config.kv_unified:
                    slot.tokens, slot.checkpoints = [], ()

    def admit(self) -> None:
        """Nothing to do: tasks start in ``submit`` or when a slot is released."""

    def remove_waiting(self, task: SimTask) -> None:
        """Drop a deferred task (client left while queued)."""
        if task in self.deferred:
            self.deferred.remove(task)

    def _launch(self, slot: Slot, task: SimTask) -> bool:
        """Start ``task`` on ``slot``; False when it was refused (prompt longer than the slot)."""
        slot.task = task
        slot.last_task = task
        task.slot = slot.id
        if len(task.prompt) > slot.n_ctx:
            task.finished = True
            self.log.record(EventKind.REJECT, task.id, prompt_tokens=len(task.prompt), slot=slot.id)
            task.send(Update(UpdateKind.ERROR, error=context_error(len(task.prompt), slot.n_ctx)))
            self._release(slot)
            return False
        reuse = llama_reuse(
            slot.tokens, slot.checkpoints, task.prompt, hybrid=self.hybrid, cache_prompt=task.cache_prompt
        )
        task.cached = reuse.n_past
        if reuse.restores:  # a checkpoint back on the GPU: every slot waits
            self.stall_s += self.perf.profile.cache.checkpoint_restore_s
        kept, length, n_past = reuse.checkpoints, len(task.prompt), reuse.n_past
        user, first, gap = task.user_start, task.first_user, self.checkpoint_gap
        slot.checkpoints = add_checkpoints(kept, length, n_past, gap, user, first) if self.hybrid else ()
        if self.hybrid:  # the checkpoints it takes, copied off the GPU as it goes: every slot waits
            self.stall_s += self.perf.profile.checkpoints_seconds(length, n_past, user, first)
        slot.tokens = list(task.prompt[: reuse.n_past])
        self.begin(task, slot.id)
        return True

    def on_prompt_done(self, task: SimTask) -> None:
        """Count the prompt (llama counts processed tokens, excluding cached)."""
        slot = self.slots[task.slot or 0]
        slot.tokens = list(task.prompt)
        processed = len(task.prompt) - task.cached
        seconds = task.sim_prompt_end - task.sim_start
        self.n_prompt_processed += processed
        self.n_prompt_cached += task.cached
        self.prompt_seconds += seconds
        self.bucket[0] += processed
        self.bucket[1] += seconds

    def on_end(self, task: SimTask, kind: EventKind) -> None:
        """Keep the slot's tokens for reuse, count generation and release the slot."""
        slot = self.slots[task.slot or 0]
        done = len(task.prompt) - task.prefill_left
        decoded = [t.id for t in task.generated][:-1]
        slot.tokens = list(task.prompt[:done]) + decoded
        self.n_tokens_max = max(self.n_tokens_max, len(task.prompt) + task.n_emitted)
        if task.n_emitted:
            seconds = task.sim_last - task.sim_prompt_end
            self.n_predicted += task.n_emitted
            self.predict_seconds += seconds
            self.bucket[2] += task.n_emitted
            self.bucket[3] += seconds
        self._release(slot)

    def _release(self, slot: Slot) -> None:
        slot.task = None
        self._use_counter += 1
        slot.t_last_used = self._use_counter
        index = pick_deferred(self.deferred, slot.id)
        if index is not None:
            task = self.deferred[index]
            del self.deferred[index]
            self.submit(task)

    @property
    def n_processing(self) -> int:
        """Busy slots."""
        return sum(1 for s in self.slots if s.busy)

    def take_bucket(self) -> tuple[float, float]:
        """Prompt and generation throughput (tok/s) since the previous scrape; resets the window."""
        n_p, t_p, n_g, t_g = self.bucket
        self.bucket = [0, 0.0, 0, 0.0]
        return (n_p / t_p if t_p > 0 else 0.0, n_g / t_g if t_g > 0 else 0.0)
