"""Progress lines of a long preparation: counts with a rate and an ETA, and sizes as people read
them. The local processes (``local_runner``) and the Beam job's watcher (``beam_watch``) both
print through them ("data prepare: splits read 3/12 (0.8/s, ETA 0m11s)")."""

from __future__ import annotations

import logging
import time

logger = logging.getLogger(__name__)


def _size(count: int) -> str:
    return f"{count / 2**20:.1f} MiB" if count >= 2**20 else f"{count / 2**10:.1f} KiB"


class _Rate:
    """Progress lines with a rate and an ETA: one per ``every`` items or ~10 s, whichever first
    (a line per item floods a log; a terminal wants to see it move)."""

    def __init__(self, what: str, total: int, every: int = 100, seconds: float = 10.0):
        self.what, self.total, self.every, self.seconds = what, total, every, seconds
        self.started = self.last = time.perf_counter()
        self.done = self.last_done = 0

    def tick(self, count: int = 1) -> None:
        self.done += count
        now = time.perf_counter()
        if (
            self.done == self.total
            or self.done - self.last_done >= self.every
            or (now - self.last >= self.seconds)
        ):
            self.last, self.last_done = now, self.done
            rate = self.done / max(now - self.started, 1e-9)
            eta = (self.total - self.done) / rate if rate > 0 else float("inf")
            logger.info(
                "%s %d/%d (%.1f/s, ETA %s)", self.what, self.done, self.total, rate, _eta(eta)
            )


def _eta(seconds: float) -> str:
    if seconds == float("inf"):
        return "unknown"
    minutes, secs = divmod(int(round(seconds)), 60)
    hours, minutes = divmod(minutes, 60)
    return f"{hours}h{minutes:02d}m" if hours else f"{minutes}m{secs:02d}s"
