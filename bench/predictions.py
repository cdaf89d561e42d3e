"""How far the cost model's predictions are from what the engines would really have given, per decision.

    .venv/bin/python bench/predictions.py ROW [--profile cost] [--worst 10] [--seed N]

(ROW: any row of bench/routing.py or of its validation set; the Mooncake rows at their load.)

Replays a workload of bench/routing.py in virtual time (``gateway.replay.virtual``). When each request
is routed, every engine model is asked what the request would get there at that moment
(``backends.sim.whatif``: vLLM, and every llama.cpp slot); the decision log says what the gateway
predicted for the same candidates. It prints, per backend, the predictions' bias and mean absolute
error (predicted - true TTFT) overall and by the predicted queue, how often the predicted cached tokens
were right, and how many decisions chose a candidate worse than the best one at that moment (and what
that cost), then the worst of those. The numbers are simulated seconds: one run is the answer.

Then the same for the candidate each decision chose, against what its request really got
(``against the outcome``), by the predicted queue and by where the cached tokens were expected to come
from. The two differ where the moment of the decision is not the moment the request starts: the
what-if of a busy llama.cpp slot counts the work ahead on that slot alone (not the other slots'
prompts and decode steps that share the server meanwhile, nor what arrives later), and restores
nothing from the RAM cache there (the slot is not idle now; when it frees, the request may load its
conversation back). On a saturated llama-server the first section's numbers are then far from what
happened (issue #45, contention-32-8llama's seed 8: cached tokens right in 3,124 of 3,128 what-ifs,
while the chosen candidates reused 14,205 tokens a request more than predicted).
"""

from __future__ import annotations

import argparse
import statistics
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from routing_validation import VALIDATION
from routing_workloads import MODEL, WORKLOADS

from backends.sim.llama_engine import LlamaEngine
from backends.sim.task import SimTask
from backends.sim.vllm_engine import VllmEngine
from backends.sim.whatif import whatif_slots, whatif_vllm
from gateway.logging import configure_logging
from gateway.replay.fleets import capacity, default_fleet, fleet_from_file, sim_configs
from gateway.replay.results import Result
from gateway.replay.traces import TraceRequest, rate_for_load, with_model, with_rate
from gateway.replay.virtual import GatewayReplay, run_now

QUEUE_BANDS = ((0.0, 0.001), (0.001, 1.0), (1.0, 3.0), (3.0, float("inf")))


class Observed(GatewayReplay):
    """A gateway replay that notes every candidate's true TTFT and cached tokens when it routes."""

    truth: dict[str, dict[tuple[str, int | None], tuple[float, int]]]

    def send(self, index: int, request: TraceRequest, task: SimTask) -> None:
        here: dict[tuple[str, int | None], tuple[float, int]] = {}
        for name, engine in self.engines.items():
            if isinstance(engine, LlamaEngine):
                for option in whatif_slots(engine, task.prompt, task.user_start, task.first_user):
                    here[name, option.slot] = (option.ttft_s, option.cached_tokens)
            elif isinstance(engine, VllmEngine):
                option = whatif_vllm(engine, task.prompt, request.max_tokens)
                here[name, None] = (option.ttft_s, option.cached_tokens)
        self.truth[f"r{index}"] = here
        super().send(index, request, task)


def _stats(errors: Sequence[float]) -> str:
    if not errors:
        return "-"
    bias, mae = statistics.mean(errors), statistics.mean(map(abs, errors))
    return f"n {len(errors)}, bias {bias:+.3f} s, mae {mae:.3f} s"


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("workload", choices=[w.name for w in (*WORKLOADS, *VALIDATION)])
    parser.add_argument("--profile", default="cost")
    parser.add_argument("--worst", type=int, default=10, help="decisions to show (the costliest)")
    parser.add_argument(
        "--seed", type=int, default=0, help="the draw of a generated workload (its row pools 0-31)"
    )
    args = parser.parse_args(argv)
    configure_logging("json", "warning")
    workload = next(w for w in (*WORKLOADS, *VALIDATION) if w.name == args.workload)
    if args.seed and workload.seeded is None:
        parser.error(f"{workload.name} is one draw: it has no --seed")
    trace = workload.seeded(args.seed) if workload.seeded is not None else workload.make(False)
    requests = with_model(trace, MODEL)
    settings = (
        fleet_from_file(workload.fleet, args.profile)
        if workload.fleet
        else default_fleet(MODEL, args.profile)
    )
    state = settings.state.model_copy(update={"decision_log_size": 2 * len(requests)})
    settings = settings.model_copy(update={"state": state})  # every decision kept, not the newest 1000
    configs = sim_configs(settings, MODEL)
    if workload.load is not None:  # the Mooncake rows: arrivals at the row's load, as bench/routing.py
        requests = with_rate(
            requests, rate_for_load(requests, workload.load, capacity(settings, MODEL, configs))
        )
    world = Observed(requests, settings, configs)
    world.truth = {}
    results = world.run()
    decisions: list[dict[str, Any]] = run_now(world.router.store.decisions(len(requests) * 4))
    errors: dict[str, list[tuple[float, float]]] = {}
    cached_right = cached_all = 0
    worse: list[tuple[float, str, str, str]] = []
    for entry in decisions:
        truth = world.truth[entry["request_id"].split(".")[0]]
        for candidate in entry["candidates"]:
            key = (candidate["backend"], candidate.get("slot"))
            if key not in truth or "predicted_ttft_s" not in candidate:
                continue
            ttft, cached = truth[key]
            errors.setdefault(candidate["backend"], []).append(
                (candidate["queue_s"], candidate["predicted_ttft_s"] - ttft)
            )
            cached_all += 1
            cached_right += abs(candidate["expected_cached_tokens"] - cached) <= max(64, cached // 20)
        chosen = (entry["chosen"], entry["slot"])
        best = min(truth, key=lambda k: truth[k][0])
        if chosen in truth and truth[chosen][0] > truth[best][0] + 0.05:
            lost = truth[chosen][0] - truth[best][0]
            worse.append((lost, entry["request_id"], f"{chosen[0]}/{chosen[1]}", f"{best[0]}/{best[1]}"))
    ttfts = [r.ttft_s for r in results if r.ttft_s is not None]
    print(f"{args.workload}, {args.profile}: mean TTFT {statistics.mean(ttfts):.3f} s, {len(ttfts)} requests")
    for backend, pairs in errors.items():
        print(f"  {backend}: {_stats([e for _, e in pairs])}")
        for low, high in QUEUE_BANDS:
            band = [e for q, e in pairs if low <= q < high]
            if band:
                print(f"    predicted queue {low:g}-{high:g} s: {_stats(band)}")
    print(f"  predicted cached tokens right (within 5% or 64): {cached_right} of {cached_all}")
    loss = sum(w[0] for w in worse)
    print(
        f"  decisions worse than the best at that moment: {len(worse)} of {len(decisions)}, {loss:.1f} s lost"
    )
    for lost, request_id, chosen, best in sorted(worse, reverse=True)[: args.worst]:
        print(f"    {request_id}: chose {chosen}, best {best}, +{lost:.2f} s")
    _against_outcomes(decisions, results)
    return 0


def _against_outcomes(decisions: Sequence[dict[str, Any]], results: Sequence[Result]) -> None:
    """The chosen candidates' predicted TTFT and cached tokens against their requests' results
    (module docstring), by predicted queue and by the expected cache source."""
    rows: list[tuple[float, str, float, int]] = []  # queue, source, TTFT error, cached error
    for entry in decisions:
        result = results[int(entry["request_id"].split(".")[0].removeprefix("r"))]
        picked = (entry["chosen"], entry["slot"])
        candidate = next((c for c in entry["candidates"] if (c["backend"], c.get("slot")) == picked), None)
        if result.ttft_s is None or candidate is None or "predicted_ttft_s" not in candidate:
            continue
        rows.append(
            (
                candidate["queue_s"],
                candidate.get("cache_source") or "-",
                candidate["predicted_ttft_s"] - result.ttft_s,
                candidate["expected_cached_tokens"] - result.cached_tokens,
            )
        )
    print(f"  against the outcome (the chosen candidate, predicted - real): {_outcome(rows)}")
    for low, high in QUEUE_BANDS:
        if band := [r for r in rows if low <= r[0] < high]:
            print(f"    predicted queue {low:g}-{high:g} s: {_outcome(band)}")
    for source in sorted({r[1] for r in rows}):
        print(f"    cached from {source}: {_outcome([r for r in rows if r[1] == source])}")


def _outcome(rows: Sequence[tuple[float, str, float, int]]) -> str:
    if not rows:
        return "-"
    cached = [r[3] for r in rows]
    return (
        f"{_stats([r[2] for r in rows])}; cached tokens bias {statistics.mean(cached):+.0f}, "
        f"mae {statistics.mean(map(abs, cached)):.0f}"
    )


if __name__ == "__main__":
    sys.exit(main())
