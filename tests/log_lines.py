"""A logging handler that keeps what a logger said, for the tests that read it (unit and integration)."""

from __future__ import annotations

import logging


class Lines(logging.Handler):
    """Keeps every record it is given, from DEBUG up: `lines`, the messages in order; `at_least(level)`, those
    of that level or above."""

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.records: list[tuple[int, str]] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append((record.levelno, record.getMessage()))

    @property
    def lines(self) -> list[str]:
        return [message for _level, message in self.records]

    def at_least(self, level: int) -> list[str]:
        return [message for at, message in self.records if at >= level]
