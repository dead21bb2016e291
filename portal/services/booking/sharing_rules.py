"""Checks of a request for a fraction of a shared GPU (docs/scheduling.md, "Shared GPUs").

A fraction is of one GPU: a compute share ``gpu_fraction`` (0 < f < 1), the memory it needs
``gpu_memory_mib``, or both; ``scheduler.sharing.share_on`` says what it holds on a given GPU.
Each refusal is a 400 naming the field, before anything is written.
"""

from dataclasses import replace

from portal.errors import ValidationFailed
from portal.services.inventory import selectors as inventory

MEMORY_MAX_MIB = 2**31 - 1  # the column's range


def is_fraction_request(*, gpu_fraction, gpu_memory_mib) -> bool:
    """The request asks for a fraction of a shared GPU."""
    return gpu_fraction is not None or gpu_memory_mib is not None


def check_fraction(request, *, gpus: int | None, mig_profile: str, gpu_fraction, gpu_memory_mib):
    """The request (a ``BookingRequest``) as a fraction of one shared GPU, or a refusal naming
    the field: a share out of (0, 1), memory not a positive number of MiB or above every shared
    GPU's, more than one GPU, a MIG profile, or no GPU of the site shared."""
    field = "gpu_fraction" if gpu_fraction is not None else "gpu_memory_mib"
    if gpu_fraction is not None and not 0 < gpu_fraction < 1:
        raise ValidationFailed.field("gpu_fraction", "must be greater than 0 and less than 1.")
    if gpu_memory_mib is not None and not 1 <= gpu_memory_mib <= MEMORY_MAX_MIB:
        raise ValidationFailed.field("gpu_memory_mib", "must be a positive number of MiB.")
    if mig_profile:
        raise ValidationFailed.field(
            "mig_profile", f"a MIG slice cannot be shared: give either mig_profile or {field}."
        )
    if gpus is not None and gpus != 1:
        raise ValidationFailed.field(
            "gpus", f"a fraction ({field}) is of one GPU: leave gpus out or give 1."
        )
    most = inventory.shared_gpu_memory()
    if most is None:
        raise ValidationFailed.field(field, "no GPU of this site is shared; book whole GPUs.")
    if request.gpu_model:
        most = inventory.shared_gpu_memory(gpu_model=request.gpu_model)
        if most is None:
            raise ValidationFailed.field(
                "gpu_model", f"no {request.gpu_model} GPU is shared; leave gpu_model out."
            )
    if gpu_memory_mib is not None and gpu_memory_mib > most:
        model = f" {request.gpu_model}" if request.gpu_model else ""
        raise ValidationFailed.field(
            "gpu_memory_mib",
            f"asks for {gpu_memory_mib} MiB; the largest shared{model} GPU has {most} MiB.",
        )
    # What it counts for before it is placed (scheduler.sharing.request_share): its share, or
    # its memory's share of the largest shared GPU, the least it can hold.
    share = gpu_fraction if gpu_fraction is not None else min(1.0, gpu_memory_mib / most)
    return replace(
        request,
        gpus=1,
        gpu_fraction=gpu_fraction,
        gpu_memory_mib=gpu_memory_mib,
        gpu_equivalents=share,
    )


def fraction_check_nodes(node_count: int | None, *, gpu_fraction, gpu_memory_mib) -> None:
    """A fraction is of one GPU on one node: never with node_count."""
    if node_count is not None and is_fraction_request(
        gpu_fraction=gpu_fraction, gpu_memory_mib=gpu_memory_mib
    ):
        raise ValidationFailed.field(
            "node_count", "a fraction of a shared GPU runs on one node: leave node_count out."
        )
