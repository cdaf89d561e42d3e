"""Settings: TOML file, environment overrides, and errors that name the field."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from gateway.settings import ConfigError, load_settings

GOOD = """
[[backends]]
id = "v"
kind = "vllm"
url = "http://127.0.0.1:9"

[[models]]
name = "m"
aliases = ["mm"]
  [[models.deployments]]
  backend = "v"
  upstream_name = "M"
"""


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "turnout.toml"
    path.write_text(text)
    return path


def test_good_file(tmp_path: Path) -> None:
    settings = load_settings(write(tmp_path, GOOD))
    assert settings.port == 8484
    assert settings.backends[0].base_url == "http://127.0.0.1:9"
    assert settings.models[0].deployments[0].upstream_name == "M"


def test_a_backend_names_its_engine_profile(tmp_path: Path) -> None:
    text = GOOD.replace('kind = "vllm"', 'kind = "vllm"\nengine_profile = "workstation-vllm-27b-tp2"')
    settings = load_settings(write(tmp_path, text))
    assert settings.engine_profiles()["v"].name == "workstation-vllm-27b-tp2"


def test_environment_overrides_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TURNOUT_PORT", "9999")
    monkeypatch.setenv("TURNOUT_LIMITS__MAX_BODY_BYTES", "1234")
    settings = load_settings(write(tmp_path, "port = 1\n" + GOOD))
    assert (settings.port, settings.limits.max_body_bytes) == (9999, 1234)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (GOOD.replace('kind = "vllm"', 'kind = "tgi"'), "backends.0.kind"),
        (GOOD.replace('backend = "v"', 'backend = "w"'), "unknown backend 'w'"),
        (GOOD.replace('aliases = ["mm"]', 'aliases = ["m"]'), "'m' is used twice"),
        (GOOD + "\nbogus = 1\n", "bogus: Extra inputs are not permitted"),
        (GOOD.replace('url = "http://127.0.0.1:9"', 'url = "nope"'), "backends.0.url"),
        ('profile = "fastest"\n' + GOOD, "unknown profile 'fastest'"),
        ("[[backends]\n", "not valid TOML"),
        (
            GOOD.replace('kind = "vllm"', 'kind = "vllm"\nengine_profile = "nope"'),
            "backends.0: engine_profile: no engine profile named 'nope'; built-in: .*seed-5090",
        ),
        (
            GOOD.replace('kind = "vllm"', 'kind = "vllm"\nengine_profile = "seed-5090-llamacpp-27b"'),
            "is a llamacpp profile; backend 'v' is vllm",
        ),
    ],
)
def test_bad_files_name_the_field(tmp_path: Path, text: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        load_settings(write(tmp_path, text))


def test_missing_file(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="cannot read config file"):
        load_settings(tmp_path / "absent.toml")


def test_bundled_demo_config_is_valid() -> None:
    from gateway.demo import demo_settings

    settings = demo_settings()
    assert {m.name for m in settings.models} == {"qwen3.8-27b", "qwen3.8-flash-next"}
    assert [d.backend for m in settings.models if m.name == "qwen3.8-flash-next" for d in m.deployments] == [
        "llama-moe"
    ]


def test_the_documented_custom_profile_loads(tmp_path: Path) -> None:
    """The TOML snippet of docs/adding-a-policy.md is a valid profile."""
    doc = (Path(__file__).parents[2] / "docs" / "adding-a-policy.md").read_text()
    snippet = doc.split("```toml\n", 1)[1].split("```", 1)[0]
    settings = load_settings(write(tmp_path, snippet + GOOD))
    profile = settings.routing_profile()
    assert profile.name == "roomy"
    assert dict(profile.scorers) == {"ttft": 1.0, "kv-headroom": 0.3}


def test_a_profile_of_your_own_warms_only_when_it_says_so(tmp_path: Path) -> None:
    text = 'profile = "p"\n[[profiles]]\nname = "p"\nscorers = { ttft = 1.0 }\n'
    assert not load_settings(write(tmp_path, text + GOOD)).routing_profile().warms
    warms = text.replace("scorers", "warms = true\nscorers")
    assert load_settings(write(tmp_path, warms + GOOD)).routing_profile().warms
    assert load_settings(write(tmp_path, GOOD)).routing_profile().warms  # the default: cost


def test_profile_with_unknown_scorer_names_it(tmp_path: Path) -> None:
    text = 'profile = "p"\n[[profiles]]\nname = "p"\nscorers = { nope = 1.0 }\n' + GOOD
    with pytest.raises(ConfigError, match=r"profiles\.0: profile 'p': unknown scorer 'nope'"):
        load_settings(write(tmp_path, text))


def test_the_readme_configuration_is_valid(tmp_path: Path) -> None:
    readme = (Path(__file__).resolve().parents[2] / "README.md").read_text(encoding="utf-8")
    blocks = [b.split("```", 1)[0] for b in readme.split("```toml\n")[1:]]
    example = next(b for b in blocks if "[[models]]" in b and "[state]" in b)
    settings = load_settings(write(tmp_path, example))
    assert settings.models[0].max_output_tokens == 16384
    assert settings.models[0].display_name == "Qwen3.8 27B"


def test_an_admin_token_is_required_off_loopback(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("TURNOUT_ADMIN__TOKEN", raising=False)
    with pytest.raises(
        ConfigError, match=re.escape("admin.token: required when the gateway listens on '0.0.0.0'")
    ):
        load_settings(None, host="0.0.0.0")
    assert load_settings(None, host="127.0.0.1").admin.token is None  # a token is made at start-up
    assert load_settings(None, host="::1").admin.token is None
    assert load_settings(None, host="0.0.0.0", admin={"token": "t"}).admin.token is not None
    assert not load_settings(None, host="0.0.0.0", admin={"enabled": False}).admin.enabled


RESIDENCY = (
    GOOD
    + """
[[backends]]
id = "l"
kind = "llamacpp"
url = "http://127.0.0.1:10"

[[backends]]
id = "o"
kind = "openai"
url = "http://127.0.0.1:11"

[[residency]]
name = "cards"
awake = "l"
  [[residency.members]]
  backend = "v"
  sleep_level = 2
  [[residency.members]]
  backend = "l"
  router_model = "q27"
"""
)


def test_a_residency_set_names_its_members_and_how_they_sleep(tmp_path: Path) -> None:
    settings = load_settings(write(tmp_path, RESIDENCY))
    (cards,) = settings.residency
    assert (cards.first_awake, cards.wait_s, cards.drain_s) == ("l", 30.0, 600.0)
    member = settings.residency_member("v")
    assert member is not None
    assert member.sleep_level == 2
    assert settings.residency_member("o") is None
    assert (
        load_settings(write(tmp_path, RESIDENCY.replace('awake = "l"\n', ""))).residency[0].first_awake == "v"
    )


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (('backend = "v"\n  sleep', 'backend = "x"\n  sleep'), "residency.cards: unknown backend 'x'"),
        (('backend = "v"\n  sleep', 'backend = "o"\n  sleep'), "'o' is openai: only vLLM .* and llama.cpp"),
        (('backend = "l"\n  router', 'backend = "v"\n  router'), "residency.cards: a member is listed twice"),
        (('awake = "l"', 'awake = "o"'), "awake 'o' is not one of its members"),
        (("sleep_level = 2", "sleep_level = 3"), "sleep_level"),
        (('name = "cards"', 'name = "my cards"'), "residency.0.name"),
    ],
)
def test_a_bad_residency_set_is_refused_with_the_reason(
    tmp_path: Path, change: tuple[str, str], message: str
) -> None:
    with pytest.raises(ConfigError, match=message):
        load_settings(write(tmp_path, RESIDENCY.replace(*change)))


def test_a_backend_is_in_one_residency_set_at_most(tmp_path: Path) -> None:
    members = "".join(f'  [[residency.members]]\n  backend = "{b}"\n' for b in ("v", "l"))
    with pytest.raises(ConfigError, match="'v' is already in the set 'cards'"):
        load_settings(write(tmp_path, RESIDENCY + f'\n[[residency]]\nname = "more"\n{members}'))
    with pytest.raises(ConfigError, match="two sets have the same name"):
        load_settings(write(tmp_path, RESIDENCY + f'\n[[residency]]\nname = "cards"\n{members}'))
