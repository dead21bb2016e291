"""A booking's container image: the site's allow-list and whether any node can run it.

The agent runs the command in the image (agents/containers.py); how an image reference is read
and which allow-list entries admit it is ``agents.images``, and which runtimes can run which
image is ``agents.protocol.image_runtimes``: the same rules on both sides. Refusals are 400s
naming ``image``.
"""

from django.conf import settings

from agents.images import ImageError, image_allowed, image_parse
from agents.protocol import IMAGE_MAX, image_runtimes
from portal.errors import ValidationFailed
from portal.models import Booking
from portal.services.inventory import selectors as inventory


def image_check(
    *, image: str | None, command: str, interactive: str, gpu_model: str, mig_profile: str
) -> str:
    """The image a submission names, checked ("" for none): a reference its runtime would run
    (agents.images), from an allowed source (CONTAINER_IMAGE_SOURCES), with a command to run,
    not a session, and at least one node with devices of the kind asked for has a runtime that
    can run it."""
    image = (image or "").strip()
    if not image:
        return ""
    _source_check(image)
    if not command:
        raise ValidationFailed.field("image", "a container runs a command: give one.")
    if interactive != Booking.Interactive.NONE:
        raise ValidationFailed.field("image", "an interactive session cannot run in an image.")
    needs = image_runtimes(image)
    nodes = inventory.node_container_runtimes(gpu_model=gpu_model, mig_profile=mig_profile)
    if not any(set(needs) & set(runtimes) for runtimes in nodes.values()):
        kind = f" with {gpu_model} GPUs" if gpu_model else ""
        raise ValidationFailed.field(
            "image", f"no node{kind} can run it: it needs {' or '.join(needs)}."
        )
    return image


def _source_check(image: str) -> None:
    if len(image) > IMAGE_MAX:
        raise ValidationFailed.field("image", f"at most {IMAGE_MAX} characters.")
    sources = settings.CONTAINER_IMAGE_SOURCES
    if not sources:
        raise ValidationFailed.field(
            "image", "this site runs no container images (CONTAINER_IMAGE_SOURCES is empty)."
        )
    try:
        parsed = image_parse(image)
    except ImageError as exc:
        raise ValidationFailed.field("image", f"not an image reference: {exc}.") from None
    if not image_allowed(parsed, sources):
        allowed = ", ".join(sources)
        raise ValidationFailed.field("image", f"not from an allowed source ({allowed}).")
