"""The shared tokenizer and chat rendering: deterministic, ChatML-aware, identical in both simulators."""

from __future__ import annotations

from backends.sim import tokenizer
from backends.sim.chat import render_chat
from backends.sim.tokenizer import IM_END, IM_START, SPECIAL_IDS
from tests.backends.sim.simhelp import LONG_TEXT, WEATHER_TOOL, running, user


class TestTokenizer:
    def test_same_text_same_ids(self) -> None:
        """Encoding is a pure function of the text."""
        assert tokenizer.encode(LONG_TEXT) == tokenizer.encode(LONG_TEXT)
        assert tokenizer.count(LONG_TEXT) == len(tokenizer.encode(LONG_TEXT))

    def test_pieces_round_trip(self) -> None:
        """Pieces concatenate back to the text, non-ASCII included."""
        text = "Héllo wörld, naïve café — 12345 tokens_here!\n\tend"
        assert "".join(tokenizer.pieces(text)) == text

    def test_english_ratio(self) -> None:
        """English prose is roughly 3.5-4 characters per token."""
        ratio = len(LONG_TEXT) / tokenizer.count(LONG_TEXT)
        assert 3.0 <= ratio <= 4.5

    def test_special_tokens_are_single_ids(self) -> None:
        """ChatML markers are one fixed id each."""
        ids = tokenizer.encode(f"{IM_START}user\nhi{IM_END}")
        assert ids[0] == SPECIAL_IDS[IM_START]
        assert ids[-1] == SPECIAL_IDS[IM_END]
        assert len(ids) == 5

    def test_chat_history_is_prefix_stable(self) -> None:
        """Appending turns only appends tokens."""
        first = [user(LONG_TEXT)]
        longer = [*first, {"role": "assistant", "content": "Sure, here it is."}, user("thanks")]
        a = tokenizer.encode(render_chat(first, add_generation_prompt=False))
        b = tokenizer.encode(render_chat(longer))
        assert b[: len(a)] == a


class TestCountAgreement:
    def test_both_simulators_count_the_same_prompt(self) -> None:
        """The same chat request has the same prompt_tokens on both simulators and in vLLM /tokenize."""
        body = {
            "messages": [
                {"role": "system", "content": "Be brief."},
                user([{"type": "text", "text": LONG_TEXT}]),
            ],  # type: ignore[arg-type]
            "tools": [WEATHER_TOOL],
            "tool_choice": "none",
            "max_tokens": 2,
        }
        with running("llamacpp") as (llama, _):
            llama_usage = llama.post("/v1/chat/completions", json=body).json()["usage"]
        with running("vllm") as (vllm, _):
            vllm_usage = vllm.post("/v1/chat/completions", json=body).json()["usage"]
            count = vllm.post("/tokenize", json={"messages": body["messages"], "tools": body["tools"]}).json()
        assert llama_usage["prompt_tokens"] == vllm_usage["prompt_tokens"] == count["count"]
