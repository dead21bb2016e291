"""Driving a real agent in tests: cycle it until something holds (no sleeping for a fixed time)."""

import time


def cycle_until(agent, condition, timeout_s: float = 15.0) -> None:
    """Run agent cycles until `condition()` holds; fail after `timeout_s`."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        agent.handle_one_cycle()
        if condition():
            return
        time.sleep(0.05)
    raise AssertionError(f"condition not met within {timeout_s} s")
