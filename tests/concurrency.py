"""Racing threads on real connections, for the concurrency tests."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

from django.db import connection


def race(count: int, action: Callable[[int], Any]) -> list[Any]:
    """Run ``action(i)`` in ``count`` threads released together; return results or errors."""
    barrier = threading.Barrier(count)
    results: list[Any] = [None] * count

    def body(index: int) -> None:
        try:
            barrier.wait(timeout=30)
            results[index] = action(index)
        except Exception as exc:  # reported by the assertions
            results[index] = exc
        finally:
            connection.close()

    threads = [threading.Thread(target=body, args=(i,)) for i in range(count)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    return results
