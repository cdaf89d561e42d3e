"""What no router can beat on a trace, by the engines' own rules (the engine models of the virtual
replay, each turn alone): the floors the routing benchmark's Targets quote where ``cost`` misses
(``routing_report.agent_peer_bound``, ``routing_report.agent_target``)."""

from __future__ import annotations

from collections.abc import Sequence

from routing_workloads import MODEL, WORKLOADS

from backends.sim.prefix_cache import add_checkpoints, common_prefix, llama_reuse
from gateway.replay.report import LONG_PROMPT_TOKENS
from gateway.replay.synth import prompt_tokens, threaded, user_starts
from gateway.replay.traces import TraceRequest, with_model
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


def last_token_best(requests: Sequence[TraceRequest], overhead_s: float = OVERHEAD_S) -> float | None:
    """The mean time to the last token if every turn ran alone on the engine that ends it first, warm
    from its own previous turn on its llama.cpp slot (``llama_reuse`` and its checkpoints, as
    ``warm_turn_best``) or from any earlier prompt on vLLM (the whole blocks of a previous prompt and
    answer that it extends), each answer cut at what the engine's window leaves (as the replay cuts
    it) and decoded at batch 1 at the prompt's context. Both warm at once, nothing beside it and no
    context growth while it decodes: what no routing can beat on this trace."""
    configs = StackOptions(model=MODEL).sim_configs()
    llama, vllm = configs["llama"].engine_profile, configs["vllm"]
    block, gap = vllm.cache_block_size, llama.prefill.checkpoint_gap
    ends: list[float] = []
    previous: dict[str | None, tuple[list[int], tuple[int, ...]]] = {}
    cached_on_vllm: list[list[int]] = []
    for request in threaded(requests):
        prompt = prompt_tokens(request)
        tokens, checkpoints = previous.get(request.session, ([], ()))
        reuse = llama_reuse(tokens, checkpoints, prompt, hybrid=True)
        user, first = user_starts(request)
        checkpoints = add_checkpoints(reuse.checkpoints, len(prompt), reuse.n_past, gap, user, first)
        answer = min(request.max_tokens, max(configs["llama"].context_window - len(prompt), 0))
        previous[request.session] = (prompt + [ANSWER_TOKEN.id] * max(answer - 1, 0), checkpoints)
        on_llama = llama.prefill_seconds(len(prompt) - reuse.n_past, reuse.n_past, user, first_user=first)
        best = on_llama + max(answer - 1, 0) * llama.decode_step_seconds(1, len(prompt))
        answer = min(request.max_tokens, vllm.context_window - len(prompt))
        if answer > 0:
            shared = max((common_prefix(held, prompt) for held in cached_on_vllm), default=0)
            blocks = min(shared, len(prompt) - 1) // block * block
            on_vllm = vllm.engine_profile.prefill_seconds(len(prompt) - blocks, blocks)
            best = min(best, on_vllm + (answer - 1) * vllm.engine_profile.decode_step_seconds(1, len(prompt)))
            cached_on_vllm.append(prompt + [ANSWER_TOKEN.id] * (answer - 1))
        ends.append(overhead_s + best)
    return sum(ends) / len(ends) if ends else None


def agent_trace(quick: bool) -> list[TraceRequest]:
    """The agent row's requests, as its replay sends them."""
    agent = next(w for w in WORKLOADS if w.name == "agent")
    return with_model(agent.make(quick), MODEL)
