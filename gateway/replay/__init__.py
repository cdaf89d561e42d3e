"""Trace replay: formats and generators, prompt synthesis, a runner through a real gateway over the
simulators, a hindsight oracle and reports (``turnout trace ...``, ``turnout replay ...``).

See ``docs/replay.md``. Nothing runs at import time.
"""
