"""Where a simulated vLLM's weights and KV cache are while it sleeps (``backends.sim.vllm_sleep``),
and how long each step of its sleep mode takes."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class SleepTimes:
    """Seconds each step took on the H100 (vLLM 0.25, the 27B's shape, bf16 weights)."""

    level1_first_s: float = 28.2
    level1_s: float = 1.03
    wake1_s: float = 1.17
    level2_s: float = 0.12
    wake_weights_s: float = 0.25
    reload_weights_s: float = 15.3
    wake_kv_s: float = 0.13


@dataclass
class SleepState:
    """Where the weights and the KV cache are."""

    times: SleepTimes = field(default_factory=SleepTimes)
    level: int = 0  # the level of the last sleep while asleep; 0 awake
    weights: str = "gpu"  # gpu, cpu (level 1), none (level 2), garbage (level 2, woken, not reloaded)
    kv_cache: bool = True
    slept_before: bool = False

    @property
    def sleeping(self) -> bool:
        return self.level > 0
