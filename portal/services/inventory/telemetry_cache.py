"""Latest device readings, kept in the cache (Redis, or local memory in embedded mode).

One key per device, so nodes reporting at the same moment never overwrite each other.
"""

from collections.abc import Iterable

from django.core.cache import cache

LATEST_TTL_S = 300


def _key(uuid: str) -> str:
    return f"telemetry:latest:{uuid}"


def latest_store(readings: dict[str, dict]) -> None:
    """Keep these readings (uuid -> reading dict) as the devices' latest."""
    cache.set_many(
        {_key(uuid): reading for uuid, reading in readings.items()}, timeout=LATEST_TTL_S
    )


def latest_by_uuid(uuids: Iterable[str] | None = None) -> dict[str, dict]:
    """The newest reading of each device that reported recently, keyed by device UUID."""
    if uuids is None:
        from portal.models import Gpu, MigInstance

        uuids = list(Gpu.objects.values_list("uuid", flat=True)) + list(
            MigInstance.objects.values_list("uuid", flat=True)
        )
    found = cache.get_many([_key(u) for u in uuids])
    return {key.rsplit(":", 1)[1]: value for key, value in found.items()}
