"""The allocator's policy as the site configures it: one builder for every portal path."""

from django.conf import settings

import scheduler


def scheduler_policy():
    """The allocator's policy from settings (weights, half-life, QOS levels, grace)."""
    return scheduler.Policy(**settings.SCHEDULER_POLICY)
