"""`gpu-portal queue --watch`: the queue again every --interval seconds until Ctrl-C, exit 0."""

import signal
import threading

from tests.cli.conftest import token_for

HEADER = "Every 0.5 s: gpu-portal queue"


def test_it_shows_the_queue_again_every_interval_until_ctrl_c_and_exits_0(site, cli):
    token = token_for(site["alice"])
    submitted = cli("submit", "-g", "1", "-t", "1h", "--json", token=token)
    assert submitted.returncode == 0, submitted.stderr
    process = cli.start("queue", "--watch", "--interval", "0.5", token=token)
    watchdog = threading.Timer(60, process.kill)  # a watch that never refreshes fails, not hangs
    watchdog.start()
    lines = []
    try:
        while sum(line.startswith(HEADER) for line in lines) < 4:
            line = process.stdout.readline()
            assert line, f"it stopped before four refreshes: {lines} {process.stderr.read()}"
            lines.append(line)
        process.send_signal(signal.SIGINT)  # Ctrl-C
        out, err = process.communicate(timeout=30)
    finally:
        watchdog.cancel()
    assert process.returncode == 0, err
    assert "Traceback" not in err and "KeyboardInterrupt" not in err, err
    screens = "".join(lines).split(HEADER)[1:]
    assert len(screens) == 4  # the fourth is only its header: Ctrl-C came then
    for screen in screens[:3]:  # each refresh is the whole table, read again from the portal
        assert "ID" in screen and "alice" in screen and "active" in screen


def test_it_refuses_a_watch_interval_out_of_bounds(site, cli):
    token = token_for(site["alice"])
    for interval in ("0", "0.1", "nan", "1e9"):
        refused = cli("queue", "--watch", "--interval", interval, token=token)
        assert refused.returncode == 2 and "from 0.5 to 3600" in refused.stderr, refused.stderr
