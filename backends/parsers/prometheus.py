"""A small parser of the Prometheus text exposition format (what both engines serve at /metrics).

Only what routing reads is kept: sample name, labels and value. ``# HELP``/``# TYPE`` lines,
timestamps and exemplars are skipped.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

_ESCAPES = {"\\": "\\", '"': '"', "n": "\n"}


@dataclass(frozen=True, slots=True)
class Sample:
    name: str
    labels: tuple[tuple[str, str], ...]
    value: float


def _parse_labels(text: str) -> tuple[tuple[str, str], ...]:
    labels: list[tuple[str, str]] = []
    i = 0
    while i < len(text):
        eq = text.index("=", i)
        key = text[i:eq].strip().lstrip(",").strip()
        if text[eq + 1] != '"':
            raise ValueError(f"label {key!r} value is not quoted")
        j = eq + 2
        value: list[str] = []
        while text[j] != '"':
            if text[j] == "\\":
                value.append(_ESCAPES.get(text[j + 1], text[j + 1]))
                j += 2
            else:
                value.append(text[j])
                j += 1
        labels.append((key, "".join(value)))
        i = j + 1
        while i < len(text) and text[i] in ", ":
            i += 1
    return tuple(labels)


def parse_samples(text: str) -> list[Sample]:
    """Every sample in ``text``; malformed lines are skipped, not fatal."""
    samples: list[Sample] = []
    for raw in text.split("\n"):  # the format's only line break: label values may hold \r, \x1e, ...
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        try:
            if "{" in line:
                name, rest = line.split("{", 1)
                label_text, value_text = rest.rsplit("}", 1)
                labels = _parse_labels(label_text)
            else:
                name, value_text = line.split(None, 1)
                labels = ()
            value = float(value_text.split()[0])
        except (ValueError, IndexError):
            continue
        samples.append(Sample(name.strip(), labels, value))
    return samples


def sum_by_name(samples: list[Sample]) -> dict[str, float]:
    """Total of each metric over all its label sets (NaN samples are ignored)."""
    totals: dict[str, float] = {}
    for sample in samples:
        if not math.isnan(sample.value):
            totals[sample.name] = totals.get(sample.name, 0.0) + sample.value
    return totals
