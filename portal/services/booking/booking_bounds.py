"""The bounds of a booking request, in one table: what the API serializer, the Book form and the
booking rules refuse, and what the agent protocol mirrors (agents/ cannot import Django, so
agents/protocol.py keeps its own constants and a portal test holds them equal to these).

Read at call time, not import time, so the site's settings (and a test's overrides) count.
"""

from dataclasses import dataclass

from django.conf import settings

COMMAND_MAX = 10_000  # characters of a batch job's command line
PROJECT_MAX = 64  # a project slug
PROFILE_MAX = 32  # a MIG profile name ("3g.40gb"); MigInstance.profile
MODEL_MAX = 64  # a GPU model name; Gpu.model
DURATION_MIN_S = 60
# A batch job's environment (agents/protocol.py keeps the same numbers for the wire).
WORKDIR_MAX = 1024  # Booking.workdir
ENV_VARS_MAX = 64
ENV_NAME_MAX = 128
ENV_VALUE_MAX = 4096
ENV_TOTAL_MAX = 65536  # characters of all names and values together


@dataclass(frozen=True)
class RequestBounds:
    """What one booking request may ask for."""

    gpus_min: int
    gpus_max: int
    duration_min_s: int
    duration_max_s: int
    command_max: int
    project_max: int
    profile_max: int
    model_max: int


def request_bounds() -> RequestBounds:
    """The site's bounds now (settings BOOKING_MAX_GPUS_PER_REQUEST, BOOKING_MAX_DURATION_S)."""
    return RequestBounds(
        gpus_min=1,
        gpus_max=settings.BOOKING_MAX_GPUS_PER_REQUEST,
        duration_min_s=DURATION_MIN_S,
        duration_max_s=settings.BOOKING_MAX_DURATION_S,
        command_max=COMMAND_MAX,
        project_max=PROJECT_MAX,
        profile_max=PROFILE_MAX,
        model_max=MODEL_MAX,
    )
