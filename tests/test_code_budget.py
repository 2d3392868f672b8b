"""The time budget of a code workflow's turn (workflows/code/budget.py), on real threads: a
turn past its budget is interrupted, time in ``outside_budget`` is not counted, and no
interruption ever lands in a thread after its turn ended, however the firing races the
disarming."""

from __future__ import annotations

import functools
import threading
import time

import pytest

from workflows.code.budget import OverBudget, TurnOverBudget, outside_budget, within


def spin() -> None:
    while True:
        pass


def test_a_turn_that_spins_is_interrupted_at_its_budget() -> None:
    began = time.monotonic()
    with pytest.raises(TurnOverBudget):
        within(0.05, spin)
    assert time.monotonic() - began >= 0.05


def test_a_turn_gives_back_what_its_code_returned_or_raised() -> None:
    assert within(1.0, lambda: 42) == 42

    def fails() -> int:
        raise KeyError("missing")

    with pytest.raises(KeyError):
        within(1.0, fails)


def test_a_turn_after_an_idle_watchdog_is_interrupted_too() -> None:
    time.sleep(0.2)  # the watchdog has nothing armed: it sleeps until told
    with pytest.raises(TurnOverBudget):
        within(0.02, spin)


def test_time_outside_the_budget_is_not_counted() -> None:
    def turn() -> int:
        with outside_budget():
            time.sleep(0.3)
        return sum(range(1000))

    assert within(0.1, turn) == 499500


def test_a_turn_that_swallows_the_interruption_is_interrupted_again() -> None:
    caught = []

    def careless() -> None:
        try:
            spin()
        except BaseException as exc:  # what a careless workflow does
            caught.append(exc)
        spin()

    with pytest.raises(TurnOverBudget):
        within(0.02, careless)
    assert len(caught) == 1


def busy(seconds: float) -> None:
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        pass


def test_no_interruption_lands_after_a_turn_ended_on_racing_threads() -> None:
    """Eight threads, each thousands of turns of 1 ms whose work sometimes passes it, so the
    watchdog fires while turns end; after its turns each thread runs plain code for a while,
    where an interruption that landed late would show."""
    stray: list[str] = []
    over = [0]
    lock = threading.Lock()

    def turns(n: int) -> None:
        for k in range(1500):
            seconds = 0.0015 if k % 7 == n % 7 else 0.0
            try:
                within(0.001, functools.partial(busy, seconds))
            except TurnOverBudget:
                with lock:
                    over[0] += 1
        try:
            busy(0.3)
        except OverBudget:
            with lock:
                stray.append(threading.current_thread().name)

    threads = [threading.Thread(target=turns, args=(n,), name=f"t{n}") for n in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert stray == []
    assert over[0] > 0  # the firing did race the disarming
