"""What the daemon has been doing lately: pages per second now and over the last hour, and
the documents that finished last. The status line, the status page and `ocrd status`
read it; nothing here decides anything."""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable

from ocrd.domain import DocumentSummary

RATE_WINDOW_SECONDS = 60.0
HISTORY_BUCKET_SECONDS = 60
HISTORY_BUCKETS = 60  # an hour
RECENT_DOCUMENTS = 100


class Activity:
    def __init__(self, clock: Callable[[], float] = time.time) -> None:
        self._clock = clock
        self._recent_pages: deque[float] = deque()
        self._buckets: deque[tuple[int, int]] = deque()  # (minute, pages), oldest first
        self.finished: deque[DocumentSummary] = deque(maxlen=RECENT_DOCUMENTS)

    def page_done(self, *_: object) -> None:
        now = self._clock()
        self._recent_pages.append(now)
        minute = int(now // HISTORY_BUCKET_SECONDS)
        if self._buckets and self._buckets[-1][0] == minute:
            self._buckets[-1] = (minute, self._buckets[-1][1] + 1)
        else:
            self._buckets.append((minute, 1))
            while len(self._buckets) > HISTORY_BUCKETS:
                self._buckets.popleft()

    def document_finished(self, summary: DocumentSummary) -> None:
        self.finished.append(summary)

    def pages_per_second(self) -> float:
        """Over the last minute."""
        cutoff = self._clock() - RATE_WINDOW_SECONDS
        while self._recent_pages and self._recent_pages[0] < cutoff:
            self._recent_pages.popleft()
        return len(self._recent_pages) / RATE_WINDOW_SECONDS

    def history(self) -> list[tuple[float, float]]:
        """(start of the minute, wall clock; pages a second in it) for each minute of the
        last hour, oldest first, idle minutes included."""
        current = int(self._clock() // HISTORY_BUCKET_SECONDS)
        counts = dict(self._buckets)
        return [
            (minute * HISTORY_BUCKET_SECONDS, counts.get(minute, 0) / HISTORY_BUCKET_SECONDS)
            for minute in range(current - HISTORY_BUCKETS + 1, current + 1)
        ]
