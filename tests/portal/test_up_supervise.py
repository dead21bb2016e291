"""`manage.py up` supervises what it starts: a child that dies is started again after a
backoff; one that keeps dying makes `up` give up (exit 1, for its service manager)."""

import os
import signal
import sys

from portal.management.commands import up

SLEEPER = [sys.executable, "-c", "import time; time.sleep(120)"]
CRASHER = [sys.executable, "-c", "import sys; sys.exit(3)"]


def _one(command: list[str]) -> up.Children:
    children = up.Children()
    children.add(lambda: [up._child(command)])
    return children


def test_it_starts_a_killed_child_again_after_its_backoff():
    children = _one(SLEEPER)
    try:
        (first,) = children.processes
        os.kill(first.pid, signal.SIGKILL)
        first.wait(timeout=10)
        assert children.supervise_once(100.0)  # seen dead: due again in 1 s
        assert children.processes == [first]
        assert children.supervise_once(100.5) and children.processes == [first]
        assert children.supervise_once(101.0)
        (second,) = children.processes
        assert second.pid != first.pid and second.poll() is None
        assert second.args == first.args
    finally:
        children.stop()
    assert all(p.poll() is not None for p in children.processes)


def test_it_gives_up_on_a_child_that_keeps_dying():
    children = _one(CRASHER)
    now, answers = 0.0, []
    try:
        for _ in range(60):
            for process in children.processes:
                process.wait(timeout=10)
            answers.append(children.supervise_once(now))
            if not answers[-1]:
                break
            now += 1.0
        assert answers[-1] is False
        assert now < up._CRASH_WINDOW_S  # five deaths within the window, with the backoffs
    finally:
        children.stop()


def test_it_starts_nothing_again_once_stopping():
    children = _one(SLEEPER)
    children.stop()
    (process,) = children.processes
    assert children.supervise_once(1000.0) and children.processes == [process]
