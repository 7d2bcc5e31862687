"""How far a training is, from what its main pod prints. Pure and serialisable: no I/O, no clock (the
times are the pod's own log timestamps).

The convention: a line of the main pod's log containing `[airflow-volcano] progress <done>/<total>`
(after any logging prefix; `done` and `total` numbers, optionally a unit word after them, e.g.
`[airflow-volcano] progress 120/1000 steps`). A script needs nothing installed to print it:

    def report_progress(done, total, unit="steps"):
        print(f"[airflow-volcano] progress {done}/{total} {unit}", flush=True)

(`airflow_volcano.waiting.progress.report_progress` is that function, for images that have the provider.)

The task log shows the progress, with percent, rate and ETA, at most once a minute or every 5 % (and
at the end); the other progress lines count as output but are not shown. After a restart the training
may resume from an earlier step: the steps it does again are counted as redone, once.
"""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass
from typing import Any

from airflow_volcano.timestamps import clock_text

PROGRESS_MARKER = "[airflow-volcano] progress "
PROGRESS = re.compile(r"\[airflow-volcano\] progress (\d+(?:\.\d+)?)\s*/\s*(\d+(?:\.\d+)?)(?:\s+([^\s].{0,31}?))?\s*$")
SHOW_EVERY_NS = 60 * 10**9  # at most one progress line a minute in the task log
SHOW_EVERY_SHARE = 0.05  # ... or one each 5 %


def report_progress(done: float, total: float, unit: str = "steps") -> None:
    """Print the progress line the provider reads (for a script in an image that has the provider)."""
    print(f"{PROGRESS_MARKER}{done}/{total} {unit}", flush=True)


def duration_text(seconds: float) -> str:
    """`45s`, `4m05s`, `2h03m`."""
    seconds = max(0, round(seconds))
    if seconds < 60:
        return f"{seconds}s"
    if seconds < 3600:
        return f"{seconds // 60}m{seconds % 60:02d}s"
    return f"{seconds // 3600}h{seconds % 3600 // 60:02d}m"


def _number(value: float) -> str:
    return f"{value:g}" if value != int(value) else str(int(value))


@dataclass
class Progress:
    """The progress a training reported, as its log told it (times are the pod's, in nanoseconds).

    :param done: steps done, as last reported; `total` of how many; `unit` the word after them.
    :param executed: steps executed, repeats included (done - the step a run started from, added up).
    :param first_done: the step the first reported run started from.
    :param resumes: how often it went back (a restart that resumed from an earlier checkpoint).
    :param redone: the steps it went back by, added up: done again (or to be), each counted once.
    :param run_start: (done, time) of the first report of the current run: its rate is measured from there.
    :param shown: (done, time) of the last report the task log showed.
    """

    done: float = 0
    total: float = 0
    unit: str = ""
    executed: float = 0
    first_done: float | None = None
    resumes: int = 0
    redone: float = 0
    last_ns: int = 0
    run_start: tuple[float, int] | None = None
    shown: tuple[float, int] | None = None

    def observe(self, message: str, at_ns: int) -> str | None:
        """A line holding PROGRESS_MARKER: the text to show for it now, or None (not due: counted, not
        shown). A line that is not a well-formed progress report is shown as it is."""
        match = PROGRESS.search(message)
        if match is None:
            return message
        done, total = float(match[1]), float(match[2])
        resumed = False
        if self.first_done is None:
            self.first_done, self.run_start = done, (done, at_ns)
        elif done < self.done:  # it went back: a restart resumed from an earlier step
            self.resumes += 1
            self.redone += self.done - done
            self.run_start, resumed = (done, at_ns), True
        else:
            self.executed += done - self.done
        self.done, self.total, self.unit, self.last_ns = done, total, match[3] or "", at_ns
        if self._due(resumed):
            self.shown = (done, at_ns)
            return self.describe()
        return None

    def _due(self, resumed: bool) -> bool:
        if self.shown is None or resumed or (self.total and self.done >= self.total):
            return True
        done, at_ns = self.shown
        return self.last_ns - at_ns >= SHOW_EVERY_NS or bool(
            self.total and (self.done - done) / self.total >= SHOW_EVERY_SHARE)

    @property
    def percent(self) -> float | None:
        return min(100.0, 100.0 * self.done / self.total) if self.total else None

    @property
    def rate(self) -> float | None:
        """Steps a second over the current run (none before two reports of it)."""
        if self.run_start is None:
            return None
        done, at_ns = self.run_start
        seconds = (self.last_ns - at_ns) / 1e9
        return (self.done - done) / seconds if seconds > 0 and self.done > done else None

    @property
    def eta_seconds(self) -> float | None:
        rate = self.rate
        if rate is None or not self.total:
            return None
        return max(0.0, self.total - self.done) / rate


    def describe(self) -> str:
        """`progress 240/1000 steps (24.0%), 3.1 steps/s, ETA 4m05s (10:42:10 UTC)`."""
        unit = f" {self.unit}" if self.unit else ""
        text = f"progress {_number(self.done)}/{_number(self.total)}{unit}"
        if (percent := self.percent) is not None:
            text += f" ({percent:.1f}%)"
        if (rate := self.rate) is not None:
            text += f", {rate:.3g} {self.unit or 'steps'}/s"
        if (eta := self.eta_seconds) is not None and self.done < self.total:
            text += f", ETA {duration_text(eta)} ({clock_text(self.last_ns / 1e9 + eta)})"
        if self.resumes:
            text += f"; resumed {self.resumes} time(s), {_number(self.redone)} {self.unit or 'steps'} redone"
        return text

    def result(self) -> dict[str, Any]:
        """What the task's return value (XCom) holds of it."""
        return {"done": self.done, "total": self.total, "unit": self.unit, "percent": self.percent,
                "rate_per_second": self.rate, "eta_seconds": self.eta_seconds, "resumes": self.resumes,
                "redone": self.redone}

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Progress:
        known = {item.name for item in dataclasses.fields(cls)}
        values = {key: value for key, value in data.items() if key in known}
        for key in ("run_start", "shown"):
            if values.get(key) is not None:
                values[key] = tuple(values[key])
        return cls(**values)
