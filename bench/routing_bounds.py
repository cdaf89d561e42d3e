"""What no router can beat on a trace, by the engines' own rules (the engine models of the virtual
replay, each turn alone): the floors the routing benchmark's Targets quote where ``cost`` misses
(``routing_report.peer_bound``, ``routing_report.agent_target``)."""

from __future__ import annotations

from collections.abc import Sequence

from routing_workloads import MODEL, WORKLOADS

from backends.sim.prefix_cache import add_checkpoints, common_prefix, llama_reuse
from gateway.replay.report import LONG_PROMPT_TOKENS
from gateway.replay.synth import prompt_tokens, threaded, user_starts
from gateway.replay.traces import TraceRequest, conversations, with_model
from gateway.replay.virtual_world import ANSWER_TOKEN, OVERHEAD_S
from gateway.replay.workstation import StackOptions


def warm_turn_best(
    requests: Sequence[TraceRequest], overhead_s: float = OVERHEAD_S, min_tokens: int = LONG_PROMPT_TOKENS
) -> float | None:
    """The mean TTFT of the prompts of ``min_tokens`` or more if every turn found its own previous
    turn in its llama.cpp slot with nothing else running (the engines' own rules: ``llama_reuse`` over
    the slot's tokens, the previous answer included, and its checkpoints), or went to vLLM when that
    was faster: what no routing can beat on this trace."""
    configs = StackOptions(model=MODEL).sim_configs()
    llama, vllm = configs["llama"], configs["vllm"]
    gap = llama.engine_profile.prefill.checkpoint_gap
    best: list[float] = []
    previous: dict[str | None, tuple[list[int], tuple[int, ...]]] = {}
    for request in threaded(requests):
        prompt = prompt_tokens(request)
        tokens, checkpoints = previous.get(request.session, ([], ()))
        reuse = llama_reuse(tokens, checkpoints, prompt, hybrid=True)
        user, first = user_starts(request)
        checkpoints = add_checkpoints(reuse.checkpoints, len(prompt), reuse.n_past, gap, user, first)
        previous[request.session] = (prompt + [ANSWER_TOKEN.id] * (request.max_tokens - 1), checkpoints)
        warm = (len(prompt) - reuse.n_past) / llama.prefill_tok_s
        if len(prompt) >= min_tokens:
            best.append(overhead_s + min(warm, len(prompt) / vllm.prefill_tok_s))
    return sum(best) / len(best) if best else None


def alone_best(
    requests: Sequence[TraceRequest], overhead_s: float = OVERHEAD_S
) -> list[tuple[float, float, bool]]:
    """Each request's floor, as (TTFT, time to the last token, an agent's call): the request alone on
    the engine that ends it first, warm from its own previous turn on its llama.cpp slot
    (``llama_reuse`` and its checkpoints, as ``warm_turn_best``) or from any earlier prompt on vLLM
    (the whole blocks of a previous prompt and answer that it extends; a conversation's turns by
    ``traces.conversations``, as the replay paces them), its answer cut at what the
    engine's window leaves (as the replay cuts it) and decoded at batch 1 at the prompt's context.
    Both warm at once, nothing beside it and no context growth while it decodes: what no routing
    can beat on this trace (the TTFT's engine may differ from the last token's)."""
    configs = StackOptions(model=MODEL).sim_configs()
    llama, vllm = configs["llama"].engine_profile, configs["vllm"]
    block, gap = vllm.cache_block_size, llama.prefill.checkpoint_gap
    floors: list[tuple[float, float, bool]] = []
    previous: dict[int, tuple[list[int], tuple[int, ...]]] = {}
    cached_on_vllm: list[list[int]] = []
    conversation = {i: n for n, chain in enumerate(conversations(requests)) for i in chain}
    for index, request in enumerate(threaded(requests)):
        prompt = prompt_tokens(request)
        tokens, checkpoints = previous.get(conversation[index], ([], ()))
        reuse = llama_reuse(tokens, checkpoints, prompt, hybrid=True)
        user, first = user_starts(request)
        checkpoints = add_checkpoints(reuse.checkpoints, len(prompt), reuse.n_past, gap, user, first)
        answer = min(request.max_tokens, max(configs["llama"].context_window - len(prompt), 0))
        previous[conversation[index]] = (prompt + [ANSWER_TOKEN.id] * max(answer - 1, 0), checkpoints)
        ttft = llama.prefill_seconds(len(prompt) - reuse.n_past, reuse.n_past, user, first_user=first)
        last = ttft + max(answer - 1, 0) * llama.decode_step_seconds(1, len(prompt))
        answer = min(request.max_tokens, vllm.context_window - len(prompt))
        if answer > 0:
            shared = max((common_prefix(held, prompt) for held in cached_on_vllm), default=0)
            blocks = min(shared, len(prompt) - 1) // block * block
            on_vllm = vllm.engine_profile.prefill_seconds(len(prompt) - blocks, blocks)
            ttft = min(ttft, on_vllm)
            last = min(last, on_vllm + (answer - 1) * vllm.engine_profile.decode_step_seconds(1, len(prompt)))
            cached_on_vllm.append(prompt + [ANSWER_TOKEN.id] * (answer - 1))
        floors.append((overhead_s + ttft, overhead_s + last, request.agent))
    return floors


def last_token_best(requests: Sequence[TraceRequest], overhead_s: float = OVERHEAD_S) -> float | None:
    """The mean time to the last token of ``alone_best``: every turn alone and warm on the engine
    that ends it first."""
    floors = alone_best(requests, overhead_s)
    return sum(last for _, last, _ in floors) / len(floors) if floors else None


def floor(name: str, key: str, quick: bool, draws: range) -> float | None:
    """Row ``name``'s floor on ``key`` (``ttft_mean_s``, ``completion_mean_s`` or ``awaited_mean_s``)
    pooled over ``draws`` (``alone_best``); None for a row not on the two-engine workstation or
    paced to a load (a long recorded trace: ``alone_best`` compares every prompt with every earlier)."""
    workload = next((w for w in WORKLOADS if w.name == name), None)
    if workload is None or workload.fleet is not None or workload.load is not None or workload.homogeneous:
        return None
    traces = (
        [workload.make(quick)]
        if quick or workload.seeded is None
        else [workload.seeded(seed) for seed in draws]
    )
    pick = {
        "ttft_mean_s": lambda ttft, last, agent: ttft,
        "completion_mean_s": lambda ttft, last, agent: last,
    }.get(key, lambda ttft, last, agent: last if agent else ttft)
    values = [pick(*f) for trace in traces for f in alone_best(with_model(trace, MODEL))]
    return sum(values) / len(values) if values else None


def agent_trace(quick: bool) -> list[TraceRequest]:
    """The agent row's requests, as its replay sends them."""
    agent = next(w for w in WORKLOADS if w.name == "agent")
    return with_model(agent.make(quick), MODEL)
