"""Trace formats and generators: deterministic, well-formed, and the Mooncake reader on the real file."""

from __future__ import annotations

import gzip
import io
import itertools
from pathlib import Path

import pytest

from gateway.replay.generate import SYSTEM_BLOCKS, agent_trace, chat_trace, contention_trace, mixed_trace
from gateway.replay.traces import (
    BLOCK_TOKENS,
    TraceError,
    TraceRequest,
    block_tokens,
    last_minutes,
    parse_lines,
    read_trace,
    scale_tokens,
    write_trace,
)

MOONCAKE = Path(__file__).resolve().parents[2].parent / "shared" / "traces" / "mooncake-conversation.jsonl"
SYNTHETIC = Path(__file__).resolve().parents[2] / "bench" / "traces" / "mooncake-synthetic.jsonl.gz"


def blocks_cover(request: TraceRequest) -> bool:
    n = len(request.hash_ids)
    return (n - 1) * BLOCK_TOKENS < request.input_tokens <= n * BLOCK_TOKENS


class TestGenerators:
    def test_same_seed_same_trace_other_seed_other_trace(self) -> None:
        """Generators are deterministic from the seed."""
        assert agent_trace(seed=3) == agent_trace(seed=3)
        assert chat_trace(seed=3) == chat_trace(seed=3)
        assert mixed_trace(seed=3) == mixed_trace(seed=3)
        assert agent_trace(seed=3) != agent_trace(seed=4)

    def test_agent_sessions_grow_by_prefix_extension(self) -> None:
        """Each turn resends the previous conversation (its ids are a prefix) and grows to ~60k."""
        trace = agent_trace(agents=3, turns=10, seed=1)
        assert len(trace) == 30
        assert [r.t for r in trace] == sorted(r.t for r in trace)
        sessions: dict[str, list[TraceRequest]] = {}
        for request in trace:
            assert request.session is not None
            assert blocks_cover(request)
            sessions.setdefault(request.session, []).append(request)
        assert len(sessions) == 3
        for turns in sessions.values():
            assert turns[0].input_tokens == 4000
            assert turns[-1].input_tokens == 60_000
            for previous, current in itertools.pairwise(turns):
                assert current.input_tokens > previous.input_tokens
                assert current.hash_ids[: len(previous.hash_ids)] == previous.hash_ids

    def test_chat_requests_are_independent_and_share_the_system_prefix(self) -> None:
        trace = chat_trace(requests=50, duration=10.0, seed=2)
        assert len(trace) == 50
        assert all(r.session is None and blocks_cover(r) for r in trace)
        assert all(r.hash_ids[:SYSTEM_BLOCKS] == tuple(range(SYSTEM_BLOCKS)) for r in trace)
        own = [i for r in trace for i in r.hash_ids[SYSTEM_BLOCKS:]]
        assert len(own) == len(set(own))
        assert all(0 <= r.t <= 10.0 for r in trace)

    def test_mixed_has_both_and_distinct_ids(self) -> None:
        trace = mixed_trace(agents=2, turns=5, requests=20, seed=0)
        assert sum(r.session is None for r in trace) == 20
        assert len({r.session for r in trace if r.session}) == 2
        chat_ids = {i for r in trace if r.session is None for i in r.hash_ids[SYSTEM_BLOCKS:]}
        agent_ids = {i for r in trace if r.session for i in r.hash_ids[SYSTEM_BLOCKS:]}
        assert not chat_ids & agent_ids


class TestFormat:
    def test_write_then_parse_round_trips(self) -> None:
        trace = mixed_trace(agents=1, turns=3, requests=5, seed=0)
        out = io.StringIO()
        write_trace(trace, out)
        assert parse_lines(out.getvalue().splitlines()) == trace

    def test_messages_instead_of_hash_ids(self) -> None:
        line = '{"t": 1, "session": null, "model": "m", "messages": [{"role": "user", "content": "hi"}]}'
        (request,) = parse_lines([line])
        assert request.messages == ({"role": "user", "content": "hi"},)
        assert request.max_tokens == 128

    @pytest.mark.parametrize(
        ("line", "message"),
        [
            ('{"t": -1, "hash_ids": [1]}', "'t'"),
            ('{"t": 0}', "needs 'hash_ids' or 'messages'"),
            ('{"t": 0, "hash_ids": ["a"]}', "'hash_ids'"),
            ("not json", "not JSON"),
        ],
    )
    def test_bad_lines_name_the_line_and_field(self, line: str, message: str) -> None:
        with pytest.raises(TraceError, match="line 2") as info:
            parse_lines(["", line])
        assert message in str(info.value)

    def test_scaling_keeps_ids_and_scales_lengths(self) -> None:
        request = TraceRequest(0.0, None, "m", 10_000, tuple(range(20)), 300)
        (scaled,) = scale_tokens([request], 0.1)
        assert (scaled.input_tokens, scaled.max_tokens, scaled.hash_ids) == (1000, 30, request.hash_ids)
        assert block_tokens(0.1) == 51


@pytest.mark.skipif(not MOONCAKE.exists(), reason="shared/traces is not beside the repository")
class TestMooncake:
    def test_reads_the_first_lines_of_the_real_trace(self) -> None:
        trace = read_trace(MOONCAKE, "mooncake", model="m", limit=5)
        assert len(trace) == 5
        first = trace[0]
        assert (first.t, first.session, first.model) == (0.0, None, "m")
        assert (first.input_tokens, first.max_tokens) == (6758, 500)
        assert first.hash_ids == tuple(range(14))
        assert all(blocks_cover(r) for r in trace)
        assert all(r.hash_ids[0] == 0 for r in trace)  # they share the first block


class TestCompressedTraces:
    def test_a_gz_trace_reads_as_the_same_trace_uncompressed(self, tmp_path: Path) -> None:
        lines = [
            '{"timestamp": 1500, "input_length": 700, "output_length": 5, "hash_ids": [0, 1]}',
            '{"timestamp": 0, "input_length": 40, "output_length": 9, "hash_ids": [2]}',
        ]
        plain, packed = tmp_path / "t.jsonl", tmp_path / "t.jsonl.gz"
        plain.write_text("\n".join(lines) + "\n", encoding="utf-8")
        packed.write_bytes(gzip.compress(plain.read_bytes()))
        assert read_trace(packed, "mooncake", model="m") == read_trace(plain, "mooncake", model="m")
        assert [r.t for r in read_trace(packed, "mooncake", model="m")] == [0.0, 1.5]
        assert len(read_trace(packed, "mooncake", model="m", limit=1)) == 1

    def test_the_validation_sets_public_trace_is_mooncakes_synthetic_one(self) -> None:
        """bench/traces/mooncake-synthetic.jsonl.gz: Mooncake's FAST'25 synthetic trace, whole (its
        README: 3,993 requests, mean input 15,325 tokens, mean output 149), with prefixes that repeat
        (multi-turn conversations)."""
        trace = read_trace(SYNTHETIC, "mooncake", model="m")
        assert len(trace) == 3993
        assert round(sum(r.input_tokens for r in trace) / len(trace)) == 15325
        assert round(sum(r.max_tokens for r in trace) / len(trace)) == 149
        firsts = [r.hash_ids[0] for r in trace]
        assert len(set(firsts)) < len(firsts)  # some prompts continue an earlier one


class TestContention:
    def test_agents_over_a_shared_system_prompt_plus_one_shots(self) -> None:
        requests = contention_trace(agents=6, turns=12, seed=1, system_tokens=6000, oneshot_every=7.0)
        sessions = {r.session for r in requests if r.session}
        assert len(sessions) == 6
        system = tuple(range(-(-6000 // BLOCK_TOKENS)))
        agents = [r for r in requests if r.session is not None]
        assert all(r.hash_ids[: len(system)] == system for r in agents)
        one_shots = [r for r in requests if r.session is None]
        assert one_shots
        assert all(1500 <= r.input_tokens <= 9000 for r in one_shots)
        assert not {i for r in one_shots for i in r.hash_ids} & {i for r in agents for i in r.hash_ids}
        for session in sessions:
            turns = [r for r in requests if r.session == session]
            assert len(turns) == 12
            for before, after in itertools.pairwise(turns):
                assert 1200 <= after.input_tokens - before.input_tokens <= 3800
                assert after.hash_ids[: len(before.hash_ids) - 1] == before.hash_ids[:-1]
                assert 80 <= after.max_tokens <= 400

    def test_written_as_mooncake_it_has_no_sessions(self) -> None:
        requests = contention_trace(agents=2, turns=3, seed=0)
        out = io.StringIO()
        write_trace(requests, out, "mooncake")
        parsed = parse_lines(out.getvalue().splitlines(), "mooncake")
        assert [r.input_tokens for r in parsed] == [r.input_tokens for r in requests]
        assert [r.hash_ids for r in parsed] == [r.hash_ids for r in requests]
        assert all(r.session is None for r in parsed)


def test_last_minutes_keeps_the_trace_end() -> None:
    """``--last-minutes M``: the requests of the trace's last M minutes, up to its last arrival."""
    requests = [TraceRequest(t, None, "m", 10, (0,), 1) for t in (900.0, 0.0, 500.0, 840.0, 300.0)]
    assert [r.t for r in last_minutes(requests, 10)] == [300.0, 500.0, 840.0, 900.0]
    assert [r.t for r in last_minutes(requests, 1)] == [840.0, 900.0]
    assert last_minutes([], 5) == []
