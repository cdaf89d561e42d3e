"""``turnout calibrate``'s prompts must be fresh: an engine whose tokenizer cannot tell its word list
apart (a test model with a placeholder vocabulary maps every unknown word to one id) is refused with a
clear error, not calibrated on prompts that are all one cached prefix."""

from __future__ import annotations

import pytest

from backends.calibrate.engines import MIN_DISTINCT_TOKENS, CalibrationError, _varied


def test_a_varied_vocabulary_is_kept_as_given() -> None:
    tokens = [5, 9, *range(100, 100 + MIN_DISTINCT_TOKENS), 5]
    assert _varied(tokens) == tokens


def test_a_tokenizer_that_maps_every_word_to_one_id_is_refused() -> None:
    with pytest.raises(CalibrationError, match="1 distinct token id"):
        _varied([0] * 160)
