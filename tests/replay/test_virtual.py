"""The virtual-time replay: the engines' arithmetic, determinism, and agreement with the wall clock."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

from backends.sim import tokenizer
from backends.sim.chat import render_chat
from gateway.cli import main
from gateway.replay.fleets import PROBE_INTERVAL_S, default_fleet
from gateway.replay.generate import agent_trace, contention_trace, mixed_trace
from gateway.replay.report import LOWER_BOUND, Draw, percentile, pooled_report, report
from gateway.replay.results import ORACLE
from gateway.replay.runner import ReplayOptions, run_replay
from gateway.replay.simulate import simulate
from gateway.replay.synth import prompt_tokens
from gateway.replay.traces import TraceRequest, write_trace
from gateway.replay.virtual import GatewayReplay, run_now
from gateway.replay.virtual_oracle import OracleReplay
from gateway.replay.virtual_world import OVERHEAD_S, VirtualOptions
from gateway.replay.workstation import StackOptions
from gateway.replay.yardsticks import TEMPLATE_TOKENS, distinct_tokens, new_tokens

MODEL = "replay"


def one(tokens: int, answer: int) -> list[TraceRequest]:
    return [TraceRequest(0.0, None, MODEL, tokens, tuple(range(tokens // 512 + 1)), answer)]


@pytest.mark.parametrize(("profile", "backend", "prefill", "decode"), [
    ("prefer-vllm", "vllm", 6600.0, 64.0),
    ("prefer-llamacpp", "llama", 3000.0, 109.0),
])  # fmt: skip
def test_one_request_takes_what_the_performance_model_says(
    profile: str, backend: str, prefill: float, decode: float
) -> None:
    """Alone on an idle engine, a 1,500-token prompt's first token comes after the gateway's own time
    and its prefill; each further token one decode step later (simulated seconds, exactly)."""
    requests = one(1500, 4)
    world = GatewayReplay(requests, default_fleet(MODEL, profile), StackOptions(model=MODEL).sim_configs())
    (result,) = world.run()
    prompt = 1500 + TEMPLATE_TOKENS
    assert (result.backend, result.prompt_tokens, result.completion_tokens) == (backend, prompt, 4)
    assert result.ttft_s == pytest.approx(OVERHEAD_S + prompt / prefill, abs=1e-9)
    assert result.completion_s == pytest.approx(OVERHEAD_S + prompt / prefill + 3 / decode, abs=1e-9)


def test_the_oracle_and_a_profile_run_on_the_same_engines() -> None:
    """The oracle's placement pays the same overhead and engine time as a profile's."""
    requests = one(1500, 4)
    (gateway,) = GatewayReplay(
        requests, default_fleet(MODEL, "cost"), StackOptions(model=MODEL).sim_configs()
    ).run()
    (oracle,) = OracleReplay(requests, StackOptions(model=MODEL).sim_configs()).run()
    assert oracle.backend == "vllm"  # 6,600 tok/s beats 3,000 for a request with no future
    assert oracle.ttft_s == pytest.approx(OVERHEAD_S + (1500 + TEMPLATE_TOKENS) / 6600.0, abs=1e-9)
    assert gateway.ttft_s is not None
    assert oracle.ttft_s is not None
    assert gateway.ttft_s >= oracle.ttft_s - 1e-9


def test_a_later_turn_resumes_its_slot_4_tokens_before_the_previous_prompts_end() -> None:
    """A conversation's turns go as a chat client sends them (``synth.threaded``): the second turn
    extends the first prompt, so the hybrid llama.cpp slot restores the checkpoint 4 tokens before its
    end. Sent as one growing user message it went back to the checkpoint a micro-batch (516) before."""
    requests = [
        TraceRequest(0.0, "s", MODEL, 3000, tuple(range(6)), 16),
        TraceRequest(30.0, "s", MODEL, 5000, tuple(range(10)), 16),
    ]
    world = GatewayReplay(
        requests, default_fleet(MODEL, "prefer-llamacpp"), StackOptions(model=MODEL).sim_configs()
    )
    first, second = world.run()
    assert (first.backend, second.backend) == ("llama", "llama")
    assert second.cached_tokens == first.prompt_tokens - 4
    assert second.prompt_tokens == len(prompt_tokens(world.requests[1]))


@pytest.mark.parametrize("answer_cap", [False, True])
def test_the_router_is_told_an_answers_length_only_with_answer_cap(
    answer_cap: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Clients do not tell a router how long the answer will be: the virtual replay sends no
    ``max_tokens`` and still ends the answer at the line's length; ``answer_cap`` sends it (as the
    wall replay must), and ``cost`` then caps its expected answer by it."""
    requests = one(1500, 300)
    options = VirtualOptions(answer_cap=answer_cap)
    world = GatewayReplay(
        requests, default_fleet(MODEL, "cost"), StackOptions(model=MODEL).sim_configs(), options
    )
    asked: list[int | None] = []
    route = world.lifecycle.route

    async def spy(body: Any, endpoint: Any, headers: Any) -> Any:
        routed = await route(body, endpoint, headers)
        asked.append(routed.features.max_tokens)
        return routed

    monkeypatch.setattr(world.lifecycle, "route", spy)
    (result,) = world.run()
    assert result.completion_tokens == 300
    assert asked == ([300] if answer_cap else [None])


def test_answer_cap_is_the_virtual_replays_alone(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The wall replay always sends ``max_tokens`` (a real engine stops there): ``--answer-cap`` is refused
    there, and taken by the virtual replay."""
    trace = tmp_path / "one.jsonl"
    with trace.open("w") as handle:
        write_trace(one(1500, 4), handle)
    assert main(["replay", str(trace), "--clock", "wall", "--answer-cap"]) == 2
    assert "--answer-cap apply to --clock virtual only" in capsys.readouterr().err
    assert main(["replay", str(trace), "--answer-cap", "--no-oracle"]) == 0


def test_the_same_trace_and_options_give_the_same_report_byte_for_byte(tmp_path: Path) -> None:
    """Two runs of the command, one JSON: nothing depends on the machine or the wall clock."""
    trace = tmp_path / "mixed.jsonl"
    with trace.open("w") as handle:
        write_trace(
            mixed_trace(agents=2, turns=4, requests=12, duration=20.0, seed=3, max_context=12000), handle
        )
    outputs = []
    for run in (1, 2):
        out = tmp_path / f"report-{run}.json"
        argv = ["replay", str(trace), "--profile", "cost", "--profile", "least-loaded", "--load", "0.8"]
        assert main([*argv, "--json", str(out)]) == 0
        outputs.append(out.read_bytes())
    assert outputs[0] == outputs[1]
    assert b'"lower-bound"' in outputs[0]


def test_replay_has_no_seed_to_set(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Its answers are fixed tokens and its engines deterministic: a seed would change no number, so
    the command has none (it had one that did nothing)."""
    trace = tmp_path / "chat.jsonl"
    with trace.open("w") as handle:
        write_trace(mixed_trace(agents=1, turns=2, requests=2, duration=5.0, seed=1), handle)
    with pytest.raises(SystemExit) as exited:
        main(["replay", str(trace), "--seed", "7"])
    assert exited.value.code == 2
    assert "unrecognized arguments: --seed 7" in capsys.readouterr().err


def test_a_coroutine_that_waits_is_refused() -> None:
    """The replay runs the gateway's coroutines to their end at once; one that waits is a bug."""

    async def waits() -> None:
        await asyncio.sleep(0)

    with pytest.raises(RuntimeError, match="waited"):
        run_now(waits())


def _agreement(requests: Sequence[TraceRequest], profiles: list[str]) -> list[str]:
    stack = StackOptions(model=MODEL, time_scale=1.0, probe_interval_s=PROBE_INTERVAL_S)
    wall = report(
        run_replay(requests, profiles, stack, ReplayOptions(time_scale=1.0, wall_cap_s=240), oracle=False)
    )
    virtual = simulate(
        requests, profiles, lambda p: default_fleet(MODEL, p), MODEL, VirtualOptions(), oracle=False
    )
    simulated = report(virtual.runs)
    misses = []
    for profile in profiles:
        w, v = wall["profiles"][profile], simulated["profiles"][profile]
        assert (w["errors"], v["errors"]) == (0, 0), profile
        for key in ("ttft_mean_s", "cache_hit_ratio"):
            if abs(w[key] - v[key]) > 0.10 * max(abs(w[key]), 1e-9):
                misses.append(f"{profile} {key}: wall {w[key]} virtual {v[key]}")
    return misses


@pytest.mark.parametrize(
    "requests",
    [
        pytest.param(agent_trace(agents=1, turns=3, seed=1, model=MODEL, max_context=9000), id="agent"),
        pytest.param(
            contention_trace(agents=2, turns=2, seed=2, model=MODEL, system_tokens=3000, oneshot_every=0),
            id="contention-2",
        ),
    ],
)
def test_the_virtual_and_the_wall_clock_replays_agree(requests: list[TraceRequest]) -> None:
    """On light workloads the virtual replay and the HTTP replay at time scale 1.0 (real servers, the
    wall clock) agree within 10% on each profile's mean TTFT and cache hit (issue #26)."""
    misses = _agreement(requests, ["cost", "prefer-vllm"])
    assert not misses, "; ".join(misses)


def test_a_request_with_literal_messages_reaches_the_engine_as_they_render(tmp_path: Path) -> None:
    """A trace line with ``messages`` (no blocks) is prefilled as the simulators render it, and a
    config naming a Redis replay gateway runs on its own memory (a replay shares no state)."""
    messages = ({"role": "system", "content": "be brief"}, {"role": "user", "content": "hello " * 300})
    request = TraceRequest(0.0, None, MODEL, 0, (), 4, messages)
    settings = default_fleet(MODEL, "prefer-vllm")
    settings = settings.model_copy(
        update={"state": settings.state.model_copy(update={"url": "redis://127.0.0.1:9"})}
    )
    (result,) = GatewayReplay([request], settings, StackOptions(model=MODEL).sim_configs()).run()
    expected = tokenizer.count(render_chat(list(messages)))
    assert (result.error, result.prompt_tokens) == (None, expected)
    assert expected > 300


def test_a_pooled_report_counts_every_request_of_every_draw_once() -> None:
    """Two draws of one small workload, the same session names in both: pooled, the means are over
    all requests, a conversation stays in its draw (merged, the second draw's agent would look like
    one session spanning both), the spans add up; one draw pooled is its own report."""
    traces = [
        mixed_trace(agents=1, turns=3, requests=4, duration=6.0, seed=s, max_context=6000) for s in (5, 6)
    ]
    draws = []
    for requests in traces:
        runs = simulate(requests, ["cost"], lambda p: default_fleet(MODEL, p), MODEL, VirtualOptions())
        draws.append(Draw(runs.runs, requests, runs.bounds))
    alone = [report(d.runs, {}, d.trace, bounds=d.bounds)["profiles"] for d in draws]
    assert pooled_report(draws[:1])["profiles"] == alone[0]
    pooled = pooled_report(draws, {"draws": 2})
    assert pooled["meta"] == {"draws": 2}
    assert set(pooled["profiles"]) == {"cost", ORACLE, LOWER_BOUND}
    for name, entry in pooled["profiles"].items():
        one, two = alone[0][name], alone[1][name]
        assert entry["requests"] == one["requests"] + two["requests"] == 14, name
        weighted = (one["ttft_mean_s"] * 7 + two["ttft_mean_s"] * 7) / 14
        assert entry["ttft_mean_s"] == pytest.approx(weighted, abs=1e-4), name
    for name in ("cost", ORACLE):
        entry, one, two = pooled["profiles"][name], alone[0][name], alone[1][name]
        sessions = (one["session_completion_mean_s"] + two["session_completion_mean_s"]) / 2
        assert entry["session_completion_mean_s"] == pytest.approx(sessions, abs=1e-4), name
        tokens = [sum(r.completion_tokens for r in d.runs[name]) for d in draws]
        spans = [t / one_or_two["throughput_tok_s"] for t, one_or_two in zip(tokens, (one, two), strict=True)]
        assert entry["throughput_tok_s"] == pytest.approx(sum(tokens) / sum(spans), rel=1e-3), name
        union = [r.ttft_s for d in draws for r in d.runs[name] if r.ttft_s is not None]
        assert entry["ttft_p90_s"] == round(percentile(union, 0.9) or 0.0, 4), name
        prefilled = sum(r.prompt_tokens - r.cached_tokens for d in draws for r in d.runs[name])
        distinct = sum(distinct_tokens(new_tokens(d.trace)) for d in draws)  # each draw's own
        assert entry["prefill_amplification"] == round(prefilled / distinct, 4), name


def test_the_oracle_places_a_model_only_where_the_fleet_serves_it() -> None:
    """Replayed as the 27B on the demo's fleet (vLLM and llama-27b serve it; llama-moe serves
    Flash-Next only), the oracle uses the 27B's engines only, as every profile does:
    with a burst that keeps them busy it used to send some requests to llama-moe too."""
    from gateway.demo import demo_settings

    base = demo_settings()
    requests = [
        TraceRequest(0.01 * n, None, "qwen3.8-27b", 8000, tuple(range(1000 * n, 1000 * n + 16)), 64)
        for n in range(12)
    ]
    runs = simulate(
        requests,
        ["cost"],
        lambda p: base.model_copy(update={"profile": p}),
        "qwen3.8-27b",
        VirtualOptions(),
    )
    for name in ("cost", ORACLE):
        assert {r.backend for r in runs.runs[name]} <= {"vllm", "llama-27b"}, name
