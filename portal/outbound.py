"""Requests to destinations that users set (webhooks, Slack incoming webhooks): which may be
contacted, and the one way to contact them.

A destination is https (http only with NOTIFY_ALLOW_HTTP), and every address its host resolves
to must be public: loopback, private, link-local, multicast, reserved and unspecified addresses,
and the special-purpose blocks of _NOT_PUBLIC (6to4, Teredo, site-local ...), are refused unless
inside NOTIFY_ALLOWED_NETWORKS (a site's own receivers); IPv4-mapped and NAT64 addresses are
judged by the IPv4 address they deliver to. The check runs when
the address is set (`destination_problem`, a 400 naming the field) and again at send time
(`destination_post`), against the addresses it connects to: the connection goes to the address
that was checked, so a name that resolves differently a second later (DNS rebinding) gains
nothing. Redirects are never followed.
"""

from __future__ import annotations

import http.client
import ipaddress
import socket
import ssl
from dataclasses import dataclass
from urllib.parse import urlsplit

from django.conf import settings

_DEFAULT_PORTS = {"http": 80, "https": 443}


class DestinationRefused(Exception):
    """The destination may not be contacted; trying again will not change that."""


class DestinationUnreachable(Exception):
    """The destination could not be reached now (its name did not resolve, the connection
    failed or timed out); a later try may succeed."""


@dataclass(frozen=True)
class Answer:
    """What the destination answered: its status and body."""

    status: int
    body: bytes


# Special-purpose blocks (IANA's IPv4 and IPv6 registries) that ipaddress.is_global calls global,
# or that stand for another address: refused whatever this Python's ipaddress says of them.
_NOT_PUBLIC = {
    ipaddress.ip_network(net): kind
    for net, kind in (
        ("192.0.0.0/24", "an IETF protocol"),
        ("fec0::/10", "a site-local"),
        ("2002::/16", "a 6to4"),
        ("2001::/32", "a Teredo"),
        ("3fff::/20", "a documentation"),
        ("64:ff9b:1::/48", "a local-use NAT64"),
        ("::/96", "an IPv4-compatible"),
    )
}
# IPv6 addresses that carry an IPv4 address a gateway or a dual-stack socket delivers to: the
# IPv4 address is the one judged.
_NAT64 = ipaddress.ip_network("64:ff9b::/96")


def _embedded(ip: ipaddress.IPv4Address | ipaddress.IPv6Address):
    """The IPv4 address an IPv4-mapped or NAT64 address delivers to, else ``ip`` itself."""
    if isinstance(ip, ipaddress.IPv6Address):
        if ip.ipv4_mapped:
            return ip.ipv4_mapped
        if ip in _NAT64:
            return ipaddress.IPv4Address(int(ip) & 0xFFFFFFFF)
    return ip


def address_refused(address: str) -> str:
    """Why this IP address may not be contacted, or "" when it may."""
    ip = _embedded(ipaddress.ip_address(address.split("%", 1)[0]))
    if any(ip in ipaddress.ip_network(net, strict=False) for net in _allowed_networks()):
        return ""
    for kind in ("unspecified", "loopback", "link_local", "multicast", "private", "reserved"):
        if getattr(ip, f"is_{kind}"):
            return f"{ip} is a {kind.replace('_', '-')} address"
    for net, kind in _NOT_PUBLIC.items():
        if ip in net:
            return f"{ip} is {kind} address"
    if not ip.is_global:
        return f"{ip} is not a public address"
    return ""


def _allowed_networks() -> list[str]:
    return getattr(settings, "NOTIFY_ALLOWED_NETWORKS", [])


def _split(url: str) -> tuple[str, str, int]:
    """(scheme, host, port) of an address that may be contacted; raises DestinationRefused."""
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError as exc:
        raise DestinationRefused(f"is not a valid address ({exc}).") from None
    allowed = ("https", "http") if settings.NOTIFY_ALLOW_HTTP else ("https",)
    if parts.scheme not in allowed:
        raise DestinationRefused(
            "must be an https:// address."
            if not settings.NOTIFY_ALLOW_HTTP
            else "must be an http:// or https:// address."
        )
    if not parts.hostname:
        raise DestinationRefused("has no host.")
    if parts.username or parts.password:
        raise DestinationRefused("may not carry a user name or password.")
    if any(ord(c) < 33 or ord(c) == 127 for c in url):
        raise DestinationRefused("may not contain spaces or control characters.")
    return parts.scheme, parts.hostname, port or _DEFAULT_PORTS[parts.scheme]


def _resolve(host: str, port: int) -> list[str]:
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except (socket.gaierror, UnicodeError) as exc:
        raise DestinationUnreachable(f"{host} does not resolve ({exc}).") from None
    return list(dict.fromkeys(info[4][0] for info in infos))


def _checked_addresses(host: str, port: int) -> list[str]:
    addresses = _resolve(host, port)
    for address in addresses:
        problem = address_refused(address)
        if problem:
            raise DestinationRefused(
                f"resolves to {problem}; only public addresses (or NOTIFY_ALLOWED_NETWORKS) "
                "may receive notifications."
            )
    return addresses


def destination_problem(url: str) -> str:
    """Why a user may not set this destination, or "" when they may. A name that does not
    resolve now is accepted here (it is checked again at every send)."""
    try:
        _, host, port = _split(url)
        _checked_addresses(host, port)
    except DestinationRefused as exc:
        return str(exc)
    except DestinationUnreachable:
        return ""
    return ""


def destination_post(url: str, body: bytes, headers: dict, *, timeout: float) -> Answer:
    """POST the body to a user-set destination, connecting only to checked addresses and
    following no redirect. Raises DestinationRefused (permanent) or DestinationUnreachable."""
    scheme, host, port = _split(url)
    addresses = _checked_addresses(host, port)
    parts = urlsplit(url)
    target = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
    failure = None
    for address in addresses:
        connection = _connection(scheme, host, port, address, timeout)
        try:
            connection.request("POST", target, body=body, headers=headers)
            response = connection.getresponse()
            return Answer(response.status, response.read())
        except (OSError, http.client.HTTPException) as exc:
            failure = exc
        finally:
            connection.close()
    raise DestinationUnreachable(f"{url}: {failure}")


class _PinnedHTTPConnection(http.client.HTTPConnection):
    """Connects to the checked address; the Host header still names the host."""

    def __init__(self, host: str, port: int, address: str, timeout: float):
        super().__init__(host, port, timeout=timeout)
        self._address = address

    def connect(self):
        self.sock = socket.create_connection((self._address, self.port), self.timeout)


class _PinnedHTTPSConnection(http.client.HTTPSConnection):
    """Connects to the checked address; TLS verifies the certificate for the host name."""

    def __init__(self, host: str, port: int, address: str, timeout: float):
        super().__init__(host, port, timeout=timeout, context=ssl.create_default_context())
        self._address = address
        self._tls = ssl.create_default_context()

    def connect(self):
        raw = socket.create_connection((self._address, self.port), self.timeout)
        self.sock = self._tls.wrap_socket(raw, server_hostname=self.host)


def _connection(scheme: str, host: str, port: int, address: str, timeout: float):
    kind = _PinnedHTTPSConnection if scheme == "https" else _PinnedHTTPConnection
    return kind(host, port, address, timeout)
