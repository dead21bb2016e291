"""Start the portal's ASGI server in a subprocess: for browser and serving tests and benchmarks."""

import socket
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def daphne_start(*, port: int, env: dict, log=subprocess.DEVNULL, timeout: float = 30.0):
    """A daphne process serving portal.asgi on 127.0.0.1:port, once it accepts connections."""
    command = [sys.executable, "-m", "daphne", "-b", "127.0.0.1", "-p", str(port)]
    command.append("portal.asgi:application")
    return process_start(command, port=port, env=env, log=log, timeout=timeout)


def serve_start(
    *, port: int, env: dict, workers: int = 1, log=subprocess.DEVNULL, timeout: float = 30.0
):
    """`manage.py serve` (uvicorn, as `up` and docker-compose run it) on 127.0.0.1:port."""
    command = [sys.executable, "manage.py", "serve", "--port", str(port)]
    command += ["--workers", str(workers)]
    return process_start(command, port=port, env=env, log=log, timeout=timeout)


def process_start(
    command: list[str], *, port: int, env: dict | None, log, timeout: float, name: str = ""
) -> subprocess.Popen:
    """Start `command` in the checkout and return it once something listens on 127.0.0.1:port."""
    name = name or command[2]
    process = subprocess.Popen(command, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"{name} exited early with {process.returncode}")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.2):
                return process
        except OSError:
            time.sleep(0.1)
    process.kill()
    raise RuntimeError(f"{name} did not start listening in time")


def daphne_stop(process) -> None:
    server_stop(process)


def server_stop(process) -> None:
    process.terminate()
    try:
        process.wait(timeout=10)
    except subprocess.TimeoutExpired:
        process.kill()
