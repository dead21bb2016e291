"""The machine's speed in one number, so that figures from different machines compare.

    python benchmarks/calib.py

``calib_s()`` times the reference loop ``s = 0; for i in range(5_000_000): s += i * i`` five
times and returns the best run in seconds. Every benchmark in this folder prints it as
``calib_s`` in its JSON line. Targets are stated for ``calib_s`` = 0.39 (the 2-core development
machine) and scale linearly with it: a target of 1.5 s reads as ``1.5 * calib_s / 0.39`` here.
"""

from __future__ import annotations

import json
import time

REFERENCE_S = 0.39  # calib_s of the machine the targets were set on


def _loop() -> int:
    s = 0
    for i in range(5_000_000):
        s += i * i
    return s


def calib_s(runs: int = 5) -> float:
    """Best wall time of ``runs`` runs of the reference loop, in seconds (3 decimals)."""
    best = float("inf")
    for _ in range(runs):
        began = time.perf_counter()
        _loop()
        best = min(best, time.perf_counter() - began)
    return round(best, 3)


def scaled(target_s: float, measured_calib_s: float) -> float:
    """A target set at ``REFERENCE_S`` as it reads on a machine whose calib_s is given."""
    return target_s * measured_calib_s / REFERENCE_S


if __name__ == "__main__":
    print(json.dumps({"calib_s": calib_s()}))
