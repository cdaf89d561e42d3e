"""Model groups end to end on the simulators: one name over two models, the member chosen per request,
a conversation keeping its member until it must move (issue #28; docs/routing.md, "Model groups")."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from backends.sim import SimConfig
from gateway.settings import ConfigError, load_settings
from policies import Architecture
from tests.e2e.conftest import Stack, start_stack, stop_stack
from tests.servers import ADMIN

SMALL, LARGE = 4096, 32768
GROUP = {"name": "grp", "members": ["m-vllm", "m-llama"], "aliases": ["group-alias"]}


def sized(name: str, params_b: float, backend: str) -> dict[str, Any]:
    deployment = {"backend": backend, "upstream_name": f"up-{backend}"}
    return {"name": name, "params_total_b": params_b, "deployments": [deployment]}


@pytest.fixture(scope="module")
def stack() -> Iterator[Stack]:
    running = start_stack(
        vllm=SimConfig(kind="vllm", model="up-vllm", time_scale=0.002, context_window=SMALL,
                       architecture=Architecture.HYBRID),
        llama=SimConfig(kind="llamacpp", model="up-llama", time_scale=0.002, slots=2, context_window=LARGE),
        extra_models=[sized("small", 27, "vllm"), sized("large", 180, "llama")],
        groups=[GROUP, {"name": "sized", "members": ["small", "large"], "reasoning_floor_b": 100}],
    )  # fmt: skip
    try:
        yield running
    finally:
        stop_stack(running)


def ask(client: httpx.Client, model: str, words: int, session: str) -> httpx.Response:
    body = {"model": model, "max_tokens": 4, "messages": [{"role": "user", "content": "word " * words}]}
    response = client.post("/v1/chat/completions", json=body, headers={"x-session-id": session})
    assert response.status_code == 200, response.text
    return response


def last_decision(stack: Stack) -> dict[str, Any]:
    entries: list[dict[str, Any]] = httpx.get(
        stack.url + "/admin/api/decisions?limit=1", headers=ADMIN
    ).json()["data"]
    return entries[0]


def test_the_group_is_listed_with_the_largest_window_any_member_offers(stack: Stack) -> None:
    with stack.client() as client:
        models = {m["id"]: m for m in client.get("/v1/models").json()["data"]}
    assert {"grp", "m-vllm", "m-llama"} <= set(models)
    assert models["grp"]["context_window"] == LARGE
    assert models["grp"]["members"] == ["m-vllm", "m-llama"]  # the default first
    assert models["m-vllm"]["context_window"] == SMALL


def test_each_answer_names_the_member_that_gave_it(stack: Stack) -> None:
    with stack.client() as client:
        response = ask(client, "group-alias", 50, "names")
    member = response.headers["x-turnout-model"]
    assert member in ("m-vllm", "m-llama")
    assert response.json()["model"] == member  # not the group's name, not the engine's upstream name
    assert {"m-vllm": "vllm", "m-llama": "llama"}[member] == response.headers["x-turnout-backend"]


def test_a_conversation_keeps_its_member_while_it_fits(stack: Stack) -> None:
    with stack.client() as client:
        first = ask(client, "m-vllm", 200, "keeps")  # the conversation starts on the 27B-like member
        assert first.headers["x-turnout-model"] == "m-vllm"
        for words in (400, 800, 1600):
            response = ask(client, "grp", words, "keeps")
            assert response.headers["x-turnout-model"] == "m-vllm"
            rejected = last_decision(stack)["rejected"]
            assert {"backend": "llama", "reason": "conversation-keeps-its-model"} in [
                {k: r[k] for k in ("backend", "reason")} for r in rejected
            ]


def test_a_conversation_moves_when_it_outgrows_its_members_window(stack: Stack) -> None:
    with stack.client() as client:
        ask(client, "m-vllm", 1000, "moves")
        response = ask(client, "grp", 6000, "moves")  # past the small member's 4,096-token window
        assert response.headers["x-turnout-model"] == "m-llama"
        assert response.json()["model"] == "m-llama"
        decision = last_decision(stack)
        moved = decision["moved"]
        assert (moved["from_model"], moved["to_model"]) == ("m-vllm", "m-llama")
        assert (decision["model"], decision["chosen_model"]) == ("grp", "m-llama")
        page = httpx.get(f"{stack.url}/admin/decisions/{decision['request_id']}", headers=ADMIN)
        assert page.status_code == 200
        assert "(model m-vllm → m-llama)" in page.text  # the dashboard shows the move
        # and it keeps its new member from then on
        assert ask(client, "grp", 6200, "moves").headers["x-turnout-model"] == "m-llama"


def test_a_size_floor_picks_a_member_large_enough(stack: Stack) -> None:
    with stack.client() as client:
        for index in range(3):
            body = {
                "model": "sized",
                "max_tokens": 4,
                "messages": [{"role": "user", "content": f"hi {index}"}],
            }
            response = client.post(
                "/v1/chat/completions", json=body, headers={"x-turnout-min-params-b": "100"}
            )
            assert response.status_code == 200, response.text
            assert response.headers["x-turnout-model"] == "large"
        rejected = last_decision(stack)["rejected"]
        assert rejected == [
            {
                "backend": "vllm",
                "reason": "below-size-floor",
                "detail": "small has 27 B parameters, 100 B asked",
            }
        ]


@pytest.mark.parametrize(
    ("path", "extra"),
    [
        ("/v1/chat/completions", {"reasoning_effort": "high"}),
        ("/v1/messages", {"thinking": {"type": "enabled", "budget_tokens": 16000}, "max_tokens": 17000}),
    ],
)
def test_deep_reasoning_asks_for_the_groups_reasoning_floor(
    stack: Stack, path: str, extra: dict[str, Any]
) -> None:
    body = {
        "model": "sized",
        "max_tokens": 4,
        "messages": [{"role": "user", "content": "think hard"}],
        **extra,
    }
    with stack.client() as client:
        response = client.post(path, json=body, headers={"anthropic-version": "2023-06-01"})
        assert response.status_code == 200, response.text
        assert response.headers["x-turnout-model"] == "large"
        light = {**body, "reasoning_effort": "low"} if "reasoning_effort" in extra else {
            **body, "thinking": {"type": "enabled", "budget_tokens": 1024}}  # fmt: skip
        client.post(path, json=light, headers={"anthropic-version": "2023-06-01"})
    assert not any(r["reason"] == "below-size-floor" for r in last_decision(stack)["rejected"])


@pytest.mark.parametrize(
    ("floor", "message"),
    [
        (
            "500",
            "No model of `sized` is large enough: small has 27 B parameters, 500 B asked; large has 180 B",
        ),
        ("lots", "x-turnout-min-params-b must be a positive number of billions of parameters, not 'lots'"),
        ("-3", "must be a positive number"),
    ],
)
def test_a_floor_no_member_meets_is_a_clear_400(stack: Stack, floor: str, message: str) -> None:
    with stack.client() as client:
        body = {"model": "sized", "max_tokens": 4, "messages": [{"role": "user", "content": "hi"}]}
        response = client.post("/v1/chat/completions", json=body, headers={"x-turnout-min-params-b": floor})
        anthropic = client.post(
            "/v1/messages",
            json={**body, "max_tokens": 4},
            headers={"x-turnout-min-params-b": floor, "anthropic-version": "2023-06-01"},
        )
    assert response.status_code == 400
    error = response.json()["error"]
    assert (error["type"], error["param"]) == ("invalid_request_error", "x-turnout-min-params-b")
    assert message in error["message"]
    assert anthropic.status_code == 400
    assert anthropic.json()["error"]["type"] == "invalid_request_error"


def test_a_group_of_unknown_members_is_refused_with_the_field_named() -> None:
    backend = {"id": "v", "kind": "vllm", "url": "http://127.0.0.1:9"}
    model = {"name": "a", "deployments": [{"backend": "v", "upstream_name": "a"}]}
    with pytest.raises(ConfigError, match=r"groups\.g: 'b' is not a configured model name"):
        load_settings(None, backends=[backend], models=[model], groups=[{"name": "g", "members": ["a", "b"]}])
    with pytest.raises(ConfigError, match="groups: name or alias 'a' is used twice"):
        load_settings(None, backends=[backend], models=[model], groups=[{"name": "a", "members": ["a", "a"]}])


def pin(stack: Stack, group: str, action: str, body: dict[str, Any] | None = None) -> httpx.Response:
    return httpx.post(f"{stack.url}/admin/api/groups/{group}/{action}", json=body, headers=ADMIN)


def test_an_admin_pins_a_group_to_one_member(stack: Stack) -> None:
    with stack.client() as client:
        assert ask(client, "m-vllm", 100, "pinned").headers["x-turnout-model"] == "m-vllm"
        response = pin(stack, "grp", "pin", {"member": "m-llama"})
        assert response.status_code == 200, response.text
        assert {
            "name": "grp",
            "members": ["m-vllm", "m-llama"],
            "pinned": "m-llama",
            "profile": "cost",
        } in response.json()["groups"]
        try:
            for session in ("pinned", "fresh"):  # a conversation on the other member moves too
                assert ask(client, "grp", 150, session).headers["x-turnout-model"] == "m-llama"
                rejected = last_decision(stack)["rejected"]
                assert {"backend": "vllm", "reason": "group-pinned",
                        "detail": "grp is pinned to m-llama (not m-vllm)"} in rejected  # fmt: skip
            assert (
                ask(client, "m-vllm", 100, "by-name").headers["x-turnout-model"] == "m-vllm"
            )  # the member itself
            page = httpx.get(stack.url + "/admin/policy", headers=ADMIN).text
            assert "pinned to m-llama" in page
        finally:
            unpinned = pin(stack, "grp", "unpin")
        assert unpinned.status_code == 200
        assert {
            "name": "grp",
            "members": ["m-vllm", "m-llama"],
            "pinned": None,
            "profile": "cost",
        } in unpinned.json()["groups"]
        audit = [(e["action"], e["detail"]) for e in unpinned.json()["audit"]]
        assert audit[:2] == [("unpin", "grp"), ("pin", "grp -> m-llama")]


@pytest.mark.parametrize(
    ("group", "action", "body", "status", "message"),
    [
        ("grp", "pin", {"member": "large"}, 400, "'large' is not a member of grp; members: m-vllm, m-llama"),
        ("nope", "pin", {"member": "m-llama"}, 404, "unknown model group 'nope'; known: grp, sized"),
        ("grp", "pin", {"model": "m-llama"}, 400, 'send {"member": "<model>"}'),
        ("grp", "freeze", None, 404, "actions: pin, unpin"),
    ],
)
def test_a_bad_pin_is_refused_clearly(
    stack: Stack, group: str, action: str, body: dict[str, Any] | None, status: int, message: str
) -> None:
    response = pin(stack, group, action, body)
    assert response.status_code == status
    assert response.json()["error"]["message"] == message
    policy = httpx.get(stack.url + "/admin/api/policy", headers=ADMIN).json()
    assert all(g["pinned"] is None for g in policy["groups"])


def test_count_tokens_for_a_group_counts_with_the_member_it_would_answer_with(stack: Stack) -> None:
    body = {"model": "grp", "messages": [{"role": "user", "content": "count these words please"}]}

    def counted_by() -> set[str]:
        before = {name: len(tap.posts) for name, tap in stack.taps.items()}
        with stack.client() as client:
            response = client.post("/v1/messages/count_tokens", json=body)
        assert response.status_code == 200, response.text
        assert response.json()["input_tokens"] > 0
        return {name for name, tap in stack.taps.items() if len(tap.posts) > before[name]}

    with stack.client() as client:  # where the same request, sent for an answer, goes
        answered = client.post("/v1/messages", json={**body, "max_tokens": 4}).headers["x-turnout-backend"]
    assert counted_by() == {answered}
    other = {"vllm": "m-llama", "llama": "m-vllm"}[answered]
    assert pin(stack, "grp", "pin", {"member": other}).status_code == 200
    try:
        assert counted_by() == ({"vllm", "llama"} - {answered})
    finally:
        pin(stack, "grp", "unpin")


def test_a_group_routed_by_a_profile_of_its_own() -> None:
    """``profile = "prefer-llamacpp"`` on a group: its requests choose members by that profile, the
    gateway's own (``cost``) routes everything else; an unknown name is refused at start-up."""
    running = start_stack(
        groups=[{"name": "own", "members": ["m-vllm", "m-llama"], "profile": "prefer-llamacpp"}]
    )
    try:
        with running.client() as client:
            response = ask(client, "own", 20, "own-profile")
            assert response.headers["x-turnout-model"] == "m-llama"
            decision = last_decision(running)
            assert (decision["profile"], decision["chosen_model"]) == ("prefer-llamacpp", "m-llama")
            ask(client, "m-both", 20, "plain")
            assert last_decision(running)["profile"] == "cost"
        policy = httpx.get(running.url + "/admin/api/policy", headers=ADMIN).json()
        assert policy["groups"][0]["profile"] == "prefer-llamacpp"
    finally:
        stop_stack(running)
    backend = {"id": "v", "kind": "vllm", "url": "http://127.0.0.1:9"}
    models = [{"name": n, "deployments": [{"backend": "v", "upstream_name": n}]} for n in ("a", "b")]
    with pytest.raises(ConfigError, match=r"groups\.own\.profile: unknown profile 'fastest'"):
        load_settings(
            None,
            backends=[backend],
            models=models,
            groups=[{"name": "own", "members": ["a", "b"], "profile": "fastest"}],
        )


def test_a_prompt_too_long_for_the_pinned_member_is_an_overflow_not_a_503(stack: Stack) -> None:
    """Pinned to the small member, a prompt only the large one could hold: the client hears its API's
    context-length error (agents compact on it), not "no backend now" (agents retry that)."""
    assert pin(stack, "grp", "pin", {"member": "m-vllm"}).status_code == 200
    try:
        body = {"model": "grp", "max_tokens": 4, "messages": [{"role": "user", "content": "word " * 6000}]}
        response = httpx.post(stack.url + "/v1/chat/completions", json=body, timeout=30)
    finally:
        pin(stack, "grp", "unpin")
    assert response.status_code == 400, response.text
    assert response.json()["error"]["code"] == "context_length_exceeded"


def test_a_group_prompt_near_a_members_window_is_counted_by_an_engine(stack: Stack) -> None:
    """An estimate near the small member's 4,096-token window is checked with an engine's own count
    (as for a plain model) before routing decides on it."""
    with stack.client() as client:
        response = ask(client, "grp", 3900, "near-the-window")
    decision = httpx.get(
        f"{stack.url}/admin/api/decisions/{response.headers['x-request-id']}", headers=ADMIN
    ).json()
    assert decision["prompt_tokens_counted"] == "counted"
    assert decision["prompt_tokens_exact"] is True
