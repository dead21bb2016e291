"""'In use' or only 'booked': utilization with hysteresis, so idle noise does not flip a device."""

import os
import subprocess
import sys
from datetime import UTC, datetime, timedelta

import pytest

from agents.protocol import DeviceReading, ReadingsRequest
from portal.services.fleet.telemetry import samples_ingest
from portal.web import selectors
from portal.web.device_usage import busy_after
from tests.factories import make_active_booking, make_node

# Idle noise around the old single threshold (5 %), then real work with short dips, then rest.
NOISE = [4.0, 6.0, 4.5, 7.0, 3.5, 6.5, 5.0, 8.0]


@pytest.mark.parametrize(
    ("readings", "busy"),
    [
        ([], False),
        (NOISE, False),  # hovers between OFF and ON: never in use
        ([*NOISE, 55.0], True),
        ([55.0, *NOISE], True),  # dips above OFF keep it in use
        ([55.0, *NOISE, 2.0], False),  # at or below OFF: idle again
        ([55.0, None, None], True),  # unmeasured readings change nothing
        ([10.0], True),  # ON itself counts
        ([50.0, 3.0], False),  # and OFF itself
    ],
)
def test_it_decides_busy_with_hysteresis(readings, busy):
    assert busy_after(readings, on=10.0, off=3.0) is busy


@pytest.mark.django_db
def test_it_keeps_a_booked_device_from_flipping_on_readings_hovering_at_the_threshold(
    settings, django_capture_on_commit_callbacks
):
    settings.IN_USE_UTIL_ON, settings.IN_USE_UTIL_OFF, settings.IN_USE_WINDOW_S = 10.0, 3.0, 600
    node = make_node("node-h", gpus=1)
    gpu = node.gpus.get()
    make_active_booking([gpu])
    t0 = datetime.now(UTC) - timedelta(seconds=30)  # the booking holds it from a minute ago
    states = []
    for step, utilization in enumerate([*NOISE, 55.0, *NOISE, 2.0, *NOISE]):
        when = t0 + timedelta(seconds=5 * step)
        reading = DeviceReading(gpu.uuid, utilization, 1.0, 900, 81920, 40.0, 90.0, [])
        with django_capture_on_commit_callbacks(execute=True):
            samples_ingest(
                node=node,
                request=ReadingsRequest(hostname=node.hostname, time=when, readings=[reading]),
            )
        [row] = selectors.device_rows(now=when + timedelta(seconds=1))
        states.append(row.state)
    n = len(NOISE)
    assert states[:n] == ["booked"] * n  # the noise alone: booked all along
    assert states[n : 2 * n + 1] == ["in_use"] * (n + 1)  # work, then dips: in use all along
    assert states[2 * n + 1 :] == ["booked"] * (n + 1)  # rested (2 %): booked, noise or not


def _settings_error(**values) -> str:
    env = {**os.environ, "DJANGO_SETTINGS_MODULE": "portal.settings_test", **values}
    code = "import django; django.setup()"
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    return done.stderr


@pytest.mark.parametrize(
    ("values", "word"),
    [
        ({"IN_USE_UTIL_ON": "10", "IN_USE_UTIL_OFF": "20"}, "OFF below ON"),
        ({"IN_USE_UTIL_ON": "150"}, "OFF below ON"),
        ({"IN_USE_WINDOW_S": "0"}, "IN_USE_WINDOW_S"),
    ],
)
def test_it_refuses_an_invalid_in_use_setting_at_load(values, word):
    assert word in _settings_error(**values)
