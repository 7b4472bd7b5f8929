"""Progress bars in a log (not a terminal) redraw every few seconds, not every step."""
import io
import sys
import time

from eyas.progress import LOG_INTERVAL_S, progress


class Terminal(io.StringIO):
    def isatty(self):
        return True


def _redraws(stream, monkeypatch, steps=200) -> int:
    monkeypatch.setattr(sys, "stderr", stream)
    for _ in progress(range(steps), desc="work"):
        time.sleep(0.002)
    return stream.getvalue().count("\r")


def test_a_log_gets_a_line_every_few_seconds_not_every_step(monkeypatch):
    assert LOG_INTERVAL_S >= 5
    assert _redraws(io.StringIO(), monkeypatch) <= 3  # start, end: 200 steps in ~0.5 s


def test_a_terminal_still_sees_the_bar_move(monkeypatch):
    assert _redraws(Terminal(), monkeypatch) > 3
