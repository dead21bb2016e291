"""CPU cost of the node agent: simulated GPUs, one reading a second, a local HTTP sink.

Runs `python -m agents --simulate SPEC --interval 1` as its own process against an
in-process stand-in portal that accepts everything, and measures that process's CPU
time (utime + stime from /proc/<pid>/stat) over N seconds of wall time, after the first
reading arrived (so interpreter start-up is reported apart). Target: < 1 % of one core.

    python benchmarks/bench_agent.py [--seconds 30] [--spec 8xH100-80GB]

Prints one line of JSON.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))

from calib import calib_s  # noqa: E402

TARGET_PERCENT = 1.0
_TICKS = os.sysconf("SC_CLK_TCK")


class _Sink(BaseHTTPRequestHandler):
    """Answers every agent endpoint like a portal would, counting readings."""

    readings = 0
    register = json.dumps(
        {"node": "bench", "report_interval_s": 1, "sync_interval_s": 30, "enforcement": "report"}
    ).encode()

    def log_message(self, *args):
        pass

    def _answer(self, status: int, body: bytes) -> None:
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self):
        self._answer(200, b'{"generation": 1, "bookings": []}')

    def do_POST(self):
        self.rfile.read(int(self.headers["Content-Length"]))
        if self.path.endswith("/register/"):
            self._answer(200, self.register)
            return
        if self.path.endswith("/readings/"):
            _Sink.readings += 1
        self._answer(202, b'{"accepted": 1}')


def _cpu_seconds(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / _TICKS  # utime, stime


def _start_agent(url: str, spec: str, state_dir: str) -> subprocess.Popen:
    args = [
        sys.executable,
        "-m",
        "agents",
        "--portal",
        url,
        "--token",
        "bench",
        "--simulate",
        spec,
        "--interval",
        "1",
        "--state-dir",
        state_dir,
        "--no-push",
        "--log-level",
        "WARNING",
    ]
    return subprocess.Popen(args, cwd=ROOT)


def _wait_first_reading(agent: subprocess.Popen, timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while _Sink.readings == 0:
        if agent.poll() is not None or time.monotonic() > deadline:
            raise SystemExit("the agent never reported a reading")
        time.sleep(0.01)


def run(seconds: float, spec: str) -> dict:
    """Run the agent for `seconds` after warm-up; return the measurements."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Sink)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{server.server_address[1]}"
    with tempfile.TemporaryDirectory() as state_dir:
        agent = _start_agent(url, spec, state_dir)
        try:
            _wait_first_reading(agent)
            cpu0, wall0, readings0 = _cpu_seconds(agent.pid), time.monotonic(), _Sink.readings
            time.sleep(seconds)
            cpu1, wall1, readings1 = _cpu_seconds(agent.pid), time.monotonic(), _Sink.readings
        finally:
            agent.send_signal(signal.SIGTERM)
            agent.wait(timeout=30)
    server.shutdown()
    percent = 100 * (cpu1 - cpu0) / (wall1 - wall0)
    return {
        "spec": spec,
        "wall_s": round(wall1 - wall0, 2),
        "readings_posted": readings1 - readings0,
        "agent_cpu_s": round(cpu1 - cpu0, 3),
        "startup_cpu_s": round(cpu0, 3),
        "cpu_percent_of_one_core": round(percent, 3),
        "target_percent": TARGET_PERCENT,
        "ok": percent < TARGET_PERCENT,
        "agent_exit_code": agent.returncode,
    }


def main() -> None:
    """Parse flags, run, print one JSON line."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=30.0)
    parser.add_argument("--spec", default="8xH100-80GB")
    args = parser.parse_args()
    calib = calib_s()
    print(json.dumps({**run(args.seconds, args.spec), "calib_s": calib}))


if __name__ == "__main__":
    main()
