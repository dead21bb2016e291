"""A booking's container image, parsed as its runtime will read it, and the site's allow-list.

Shared by the portal (which refuses at submit what cannot run or is not allowed, a 400 naming
``image``) and the agent (which launches the parsed form, never the text as it came).

- An OCI image (``docker://REF`` or a plain ``REF``) is a reference in the grammar Podman and
  Docker use (github.com/distribution/reference)::

      [domain[:port]/]path-component(/path-component)*[:tag][@algorithm:hex]

  path components ``[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*``, a tag ``\\w[\\w.-]{0,127}``, a
  digest sha256, sha384 or sha512 in lower-case hex. The first component is the registry host
  when it has a ``.`` or a ``:``, is ``localhost`` or has capitals; otherwise it is
  ``docker.io`` and a single component is under ``library/``, as ``docker pull`` reads it.
  The runtime is given the full name (``docker.io/library/ubuntu:22.04``), so that no short-name
  search of the node picks another registry than the one the allow-list checked.
- ``oras://``, ``library://`` and ``shub://`` are Apptainer's transports; what follows is read
  with the same grammar (``oras://`` needs a registry host; the others may name none).
- A ``.sif`` file is an absolute path without ``..`` segments.

An allow-list entry (CONTAINER_IMAGE_SOURCES) names a transport, a host and a repository
prefix in whole path segments, or a directory: ``docker://nvcr.io`` admits every repository of
host nvcr.io (not nvcr.io.evil.example), ``docker://nvcr.io/nvidia`` those under ``nvidia/``
(not ``nvidia-evil/``), ``/shared/images`` the ``.sif`` files below that directory.
"""

from __future__ import annotations

import posixpath
import re
from collections.abc import Iterable
from dataclasses import dataclass

from agents.protocol import CONTAINER_RUNTIMES, IMAGE_MAX

OCI = "docker"
SIF_TRANSPORTS = ("oras", "library", "shub")
FILE = "file"
APPTAINER_RUNTIMES = ("apptainer", "singularity")
DEFAULT_DOMAIN = "docker.io"
NAME_MAX = 255  # the grammar's bound on domain plus path

_COMPONENT = re.compile(r"[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*")
_DOMAIN_PART = r"(?:[a-zA-Z0-9]|[a-zA-Z0-9][a-zA-Z0-9-]*[a-zA-Z0-9])"
_DOMAIN = re.compile(rf"(?:{_DOMAIN_PART}(?:\.{_DOMAIN_PART})*|\[[a-fA-F0-9:]+\])(?::[0-9]+)?")
_TAG = re.compile(r"[\w][\w.-]{0,127}", re.ASCII)  # Go's \w: ASCII
_DIGEST_HEX = {"sha256": 64, "sha384": 96, "sha512": 128}
_HEX_ID = re.compile(r"[a-f0-9]{64}")


class ImageError(ValueError):
    """The text is no image a runtime would run; the message says why."""


@dataclass(frozen=True)
class Image:
    """An image reference, parsed: its transport (``docker`` for OCI, an Apptainer transport,
    or ``file``), registry host ("" for none), repository path or file path, tag and digest."""

    transport: str
    host: str
    path: str
    tag: str = ""
    digest: str = ""

    @property
    def runtimes(self) -> tuple[str, ...]:
        """The runtimes that can run it, preferred first."""
        return CONTAINER_RUNTIMES if self.transport == OCI else APPTAINER_RUNTIMES

    @property
    def name(self) -> str:
        """The full reference, without transport: what Podman and Docker are given."""
        if self.transport == FILE:
            return self.path
        name = f"{self.host}/{self.path}" if self.host else self.path
        tag = f":{self.tag}" if self.tag else ""
        return name + tag + (f"@{self.digest}" if self.digest else "")

    @property
    def uri(self) -> str:
        """What Apptainer and Singularity are given: the path, or transport://reference."""
        return self.path if self.transport == FILE else f"{self.transport}://{self.name}"


@dataclass(frozen=True)
class Source:
    """One allow-list entry: images of this transport and host under this path prefix."""

    transport: str
    host: str
    prefix: tuple[str, ...]

    def admits(self, image: Image) -> bool:
        """Whether ``image`` is of this source: same transport and host, and its path starts
        with the prefix segment by segment."""
        segments = tuple(part for part in image.path.split("/") if part)
        return (
            image.transport == self.transport
            and image.host.lower() == self.host.lower()
            and segments[: len(self.prefix)] == self.prefix
            and (image.transport != FILE or len(segments) > len(self.prefix))
        )


def image_parse(text: str) -> Image:
    """``text`` as an image its runtime would run (ImageError says why not)."""
    if len(text) > IMAGE_MAX:
        raise ImageError(f"at most {IMAGE_MAX} characters")
    if not text or any(c.isspace() or not c.isprintable() for c in text):
        raise ImageError("an image reference has no spaces or control characters")
    transport, rest = _transport(text)
    if transport == FILE:
        if not rest.endswith(".sif"):
            raise ImageError("an image file is a .sif file")
        return Image(FILE, "", _file_path(rest))
    name, tag, digest = _split_tag_digest(rest)
    host, path = _split_domain(transport, name)
    return Image(transport, host, path, tag, digest)


def source_parse(text: str) -> Source:
    """One CONTAINER_IMAGE_SOURCES entry (ImageError says why it is not one)."""
    transport, rest = _transport(text.strip())
    if transport == FILE:
        return Source(FILE, "", tuple(part for part in _file_path(rest).split("/") if part))
    rest = rest.rstrip("/")
    first = rest.split("/", 1)[0]
    if "/" not in rest and _is_domain(first):  # a host alone: every repository of it
        host, path = _host(first), ""
    else:
        host, path = _split_domain(transport, rest, single_under_library=False)
    return Source(transport, host, tuple(path.split("/")) if path else ())


def image_allowed(image: Image, sources: Iterable[str]) -> bool:
    """Whether one of the allow-list's entries admits ``image`` (an entry that does not parse
    admits nothing; the settings refuse such an entry at start)."""
    for text in sources:
        try:
            if source_parse(text).admits(image):
                return True
        except ImageError:
            continue
    return False


def _transport(text: str) -> tuple[str, str]:
    scheme, sep, rest = text.partition("://")
    if not sep:
        if text.startswith("/") or text.endswith(".sif"):
            return FILE, text
        return OCI, text
    if scheme == OCI or scheme in SIF_TRANSPORTS:
        return scheme, rest
    raise ImageError(
        f"{scheme}:// is not a transport the runtimes take (docker, oras, library, shub)"
    )


def _file_path(path: str) -> str:
    if not path.startswith("/"):
        raise ImageError("an image file is an absolute path")
    if ".." in path.split("/"):
        raise ImageError("an image file's path has no '..'")
    return "/" + posixpath.normpath(path).lstrip("/")  # POSIX keeps a leading "//"


def _split_tag_digest(rest: str) -> tuple[str, str, str]:
    name, _, digest = rest.partition("@")
    if digest:
        _digest_check(digest)
    tag = ""
    slash = name.rfind("/")
    if ":" in name[slash + 1 :]:  # a colon after the last slash is a tag; before it, a port
        name, _, tag = name.rpartition(":")
        if not _TAG.fullmatch(tag):
            raise ImageError(f"tag {tag!r} is not a tag (letters, digits, _ . -, at most 128)")
    return name, tag, digest


def _digest_check(digest: str) -> None:
    algorithm, _, hexits = digest.partition(":")
    length = _DIGEST_HEX.get(algorithm)
    if length is None or len(hexits) != length or not re.fullmatch(r"[a-f0-9]+", hexits):
        raise ImageError(f"digest {digest!r} is not sha256:, sha384: or sha512: and its hex")


def _is_domain(first: str) -> bool:
    return any(c in first for c in ".:") or first == "localhost" or first.lower() != first


def _host(text: str) -> str:
    if not _DOMAIN.fullmatch(text):
        raise ImageError(f"{text!r} is not a registry host[:port]")
    return text


def _split_domain(
    transport: str, name: str, *, single_under_library: bool = True
) -> tuple[str, str]:
    first, slash, remainder = name.partition("/")
    if slash and _is_domain(first):
        host, path = _host(first), remainder
    elif transport == OCI:
        host, path = DEFAULT_DOMAIN, name
    else:
        host, path = "", name
    if transport == OCI and host in (DEFAULT_DOMAIN, "index.docker.io"):
        host = DEFAULT_DOMAIN
        if single_under_library and "/" not in path:
            path = f"library/{path}"
    if transport == "oras" and not host:
        raise ImageError("an oras:// image names its registry host")
    for component in path.split("/"):
        if not _COMPONENT.fullmatch(component):
            raise ImageError(
                f"{component!r} is not a repository path component "
                "(lower-case letters and digits, separated by . _ __ or -)"
            )
    if len(f"{host}/{path}") > NAME_MAX:
        raise ImageError(f"the repository name is longer than {NAME_MAX} characters")
    if transport == OCI and _HEX_ID.fullmatch(path.removeprefix("library/")):
        raise ImageError("a repository name is not a 64-digit hex id")
    return host, path
