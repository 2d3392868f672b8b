"""One side of the wake-versus-deadline race, run as its own process by tests/test_wait_races.

    python -m tests.wake_racer wake|deadline GO_AT STEP_ID...

Waits until the wall clock reaches GO_AT (so both sides start together), then either wakes
each step with an outcome (as a signal would) or fires due deadlines (as the sweep does), in
its own random order (in one shared order the first winner would stay one step ahead and
nothing after the first step would be contested), and prints the ids it won, one per line.
"""

from __future__ import annotations

import os
import random
import sys
import time


def main(side: str, go_at: float, step_ids: list[int]) -> None:
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "waymark_config.settings")
    import django

    django.setup()
    from django.db import connection, transaction

    from workflows.engine.waits import Wake, wake_step

    random.Random(side).shuffle(step_ids)
    time.sleep(max(0.0, go_at - time.time()))
    won: list[int] = []
    for step_id in step_ids:
        if side == "wake":
            with transaction.atomic():
                woke = wake_step(step_pk=step_id, wake=Wake(outcome="received", reason="signal"))
        else:
            with transaction.atomic():
                deadline = Wake(outcome="timed_out", reason="deadline_passed")
                woke = wake_step(step_pk=step_id, wake=deadline, due_only=True)
        if woke:
            won.append(step_id)
    connection.close()
    sys.stdout.write("".join(f"{step_id}\n" for step_id in won))


if __name__ == "__main__":
    main(sys.argv[1], float(sys.argv[2]), [int(arg) for arg in sys.argv[3:]])
