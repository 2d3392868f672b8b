"""Stop on SIGTERM/SIGINT: handlers only trigger a callback, and are restored on exit.

A Python signal handler runs on the main thread between two bytecodes, possibly while that
thread holds a lock the callback needs (an Event's internal condition, a worker's slot lock):
calling the callback right there could deadlock. The handler therefore hands the callback to
a new thread and returns at once.
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager

STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)


@contextmanager
def on_stop_signal(
    callback: Callable[[], None], *, received: list[int] | None = None
) -> Iterator[None]:
    """Call ``callback`` on SIGTERM or SIGINT inside the block (main thread only); each
    signal's number is appended to ``received`` first, when given."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def handler(signum: int, frame: object) -> None:
        if received is not None:
            received.append(signum)  # one append: takes no lock the main thread could hold
        threading.Thread(target=callback, name=f"signal-{signum}", daemon=True).start()

    previous = {signum: signal.signal(signum, handler) for signum in STOP_SIGNALS}
    try:
        yield
    finally:
        for signum, previous_handler in previous.items():
            signal.signal(signum, previous_handler)


def wait_for_stop_signal(run: Callable[[threading.Event], None]) -> None:
    """Run ``run(stop)`` until SIGTERM or SIGINT sets ``stop``."""
    stop = threading.Event()
    with on_stop_signal(stop.set):
        run(stop)
