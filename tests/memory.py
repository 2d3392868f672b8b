"""How much memory a piece of code takes at its peak: this process's resident set sampled
on a thread every few milliseconds while the code runs (an allocation freed before the code
returns still shows: a body read whole and dropped is seen while it was held)."""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import psutil

MIB = 1024 * 1024


@dataclass
class Peak:
    before: int = 0
    highest: int = 0

    @property
    def grew_mib(self) -> float:
        return (self.highest - self.before) / MIB


@contextmanager
def peak_rss(every: float = 0.002, pid: int | None = None) -> Iterator[Peak]:
    """This process's peak (or another's, by ``pid``) while the block runs."""
    process = psutil.Process(pid)
    peak = Peak(before=process.memory_info().rss)
    peak.highest = peak.before
    done = threading.Event()

    def sample() -> None:
        while not done.is_set():
            try:
                peak.highest = max(peak.highest, process.memory_info().rss)
            except psutil.NoSuchProcess:
                return
            done.wait(every)

    sampler = threading.Thread(target=sample, name="rss-sampler", daemon=True)
    sampler.start()
    try:
        yield peak
    finally:
        done.set()
        sampler.join(5)
        with contextlib.suppress(psutil.NoSuchProcess):
            peak.highest = max(peak.highest, process.memory_info().rss)
