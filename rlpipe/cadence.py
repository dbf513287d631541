"""`Every`: the one periodic timer of the driver and the workers, on the caller's clock
(seconds of time.monotonic(), or a count such as env steps).

A loop asks `timer.due(now)` each turn; it is True at most once per `interval` and then
counts the next interval from `now` (a late check does not bunch the following ones). It
imports nothing, so every layer may use it.
"""

from __future__ import annotations


class Every:
    """Due once `first_at` is reached (0.0: at the first check), then every `interval`."""

    __slots__ = ("interval", "next_at")

    def __init__(self, interval: float, first_at: float = 0.0):
        self.interval = interval
        self.next_at = first_at

    def due(self, now: float) -> bool:
        """True when the interval has passed; the next one starts at `now`."""
        if now < self.next_at:
            return False
        self.next_at = now + self.interval
        return True

    def passed(self, now: float) -> bool:
        """Whether it would be due, without starting the next interval."""
        return now >= self.next_at

    def restart(self, now: float) -> None:
        """The next interval starts at `now` (something else did the periodic work)."""
        self.next_at = now + self.interval
