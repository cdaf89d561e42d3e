"""The test helper that reads a service as Compose does: its rules, so the deployment tests can trust it."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.deploy.compose_run import (
    InterpolationError,
    Substitution,
    command_line,
    healthcheck_argv,
    interpolate,
    mount,
    substitute,
)


class TestInterpolate:
    @pytest.mark.parametrize(
        ("text", "env", "expected"),
        [
            ("${A}", {"A": "x"}, "x"),
            ("$A/b", {"A": "x"}, "x/b"),
            ("${A:-d}", {}, "d"),
            ("${A:-d}", {"A": ""}, "d"),
            ("${A-d}", {"A": ""}, ""),
            ("${A-d}", {}, "d"),
            ("${A:+on}", {"A": "x"}, "on"),
            ("${A:+on}", {"A": ""}, ""),
            ("${A+on}", {"A": ""}, "on"),
            ("$${A}", {"A": "x"}, "${A}"),
            ("/models/${G:-m.gguf}", {"G": "t.gguf"}, "/models/t.gguf"),
            ("${MISSING}", {}, ""),
        ],
    )
    def test_compose_rules(self, text: str, env: dict[str, str], expected: str) -> None:
        assert interpolate(text, env) == expected

    @pytest.mark.parametrize("text", ["${T:?set T in .env}", "${T?no}"])
    def test_a_required_variable_that_is_missing_is_refused(self, text: str) -> None:
        with pytest.raises(InterpolationError, match="T"):
            interpolate(text, {})
        assert interpolate(text, {"T": "v"}) == "v"

    def test_colon_question_refuses_an_empty_value_too(self) -> None:
        with pytest.raises(InterpolationError):
            interpolate("${T:?}", {"T": ""})
        assert interpolate("${T?}", {"T": ""}) == ""


class TestCommandLine:
    def test_the_exec_form_keeps_each_item_whole(self) -> None:
        service = {"entrypoint": ["vllm", "serve"], "command": ["${M:-a b}", "--x", "1,1"]}
        assert command_line(service, {}) == ["vllm", "serve", "a b", "--x", "1,1"]

    def test_a_string_is_split_like_a_shell_and_the_image_entrypoint_comes_first(self) -> None:
        assert command_line({"command": "--a 'b c'"}, {}, image_entrypoint=["srv"]) == ["srv", "--a", "b c"]


class TestMount:
    def test_a_container_path_becomes_the_host_path_bound_there(self, tmp_path: Path) -> None:
        argv = ["--model", "/models/m.gguf", "--alias", "/modelsx"]
        mounted = mount(argv, ["${DIR:-./models}:/models:ro", "named:/data"], {"DIR": str(tmp_path)})
        assert mounted == ["--model", str(tmp_path / "m.gguf"), "--alias", "/modelsx"]


class TestSubstitute:
    def test_replaces_removes_and_renames(self) -> None:
        argv = ["s", "--host", "0.0.0.0", "--tp", "2", "--gpu"]
        subs = [
            Substitution("--host", "0.0.0.0", "127.0.0.1", "loopback"),
            Substitution("--tp", "2", None, "one CPU"),
            Substitution("--gpu", None, "--cpu", "no GPU"),
        ]
        assert substitute(argv, subs) == ["s", "--host", "127.0.0.1", "--cpu"]

    def test_a_value_the_file_no_longer_writes_fails(self) -> None:
        with pytest.raises(AssertionError, match="no longer contains '--port 8080'"):
            substitute(["s", "--port", "8081"], [Substitution("--port", "8080", "1", "free port")])

    def test_a_joined_flag_is_not_the_flag(self) -> None:
        """``--port=8080`` is not ``--port 8080``: the substitution fails instead of hiding it."""
        with pytest.raises(AssertionError):
            substitute(["s", "--port=8080"], [Substitution("--port", "8080", "1", "free port")])


class TestHealthcheck:
    def test_cmd_and_shell_forms(self) -> None:
        assert healthcheck_argv(["CMD", "curl", "http://h:1/x"], {"h:1": "h:2"}) == ["curl", "http://h:2/x"]
        assert healthcheck_argv("redis-cli ping", {}) == ["/bin/sh", "-c", "redis-cli ping"]
        assert healthcheck_argv(["CMD-SHELL", "a && b"], {}) == ["/bin/sh", "-c", "a && b"]

    def test_a_replacement_the_check_does_not_contain_fails(self) -> None:
        with pytest.raises(AssertionError):
            healthcheck_argv(["CMD", "curl", "http://h:1/x"], {"h:9": "h:2"})
