"""Small helpers for reading settings from the environment (secrets may come from NAME_FILE).

A value that does not parse is a SettingError naming the variable, the value and what was
expected: a typo (``DEBUG=ture``) stops the start instead of quietly meaning something else.
Unset or empty (a compose file's ``${NAME:-}``) means the default.
"""

import ipaddress
import math
import os
from urllib.parse import quote, urlsplit, urlunsplit

from django.core.exceptions import ImproperlyConfigured

from agents.images import ImageError, source_parse

TRUE_WORDS = ("1", "true", "yes", "on")
FALSE_WORDS = ("0", "false", "no", "off")


class SettingError(ImproperlyConfigured):
    """A setting's value is wrong; the message names the variable and says what it wants."""


def env(name: str, default: str = "") -> str:
    """Return $NAME, or the contents of the file named by $NAME_FILE, or the default."""
    path = os.environ.get(f"{name}_FILE")
    if path:
        try:
            with open(path, encoding="utf-8") as f:
                return f.read().strip()
        except OSError as error:
            raise SettingError(f"{name}_FILE={path!r}: cannot read it ({error.strerror})") from None
    return os.environ.get(name, default)


def parse_bool(name: str, text: str, default: bool) -> bool:
    """``text`` as a boolean (1/0, true/false, yes/no, on/off, any case); blank is the default."""
    word = text.strip().lower()
    if not word:
        return default
    if word in TRUE_WORDS:
        return True
    if word in FALSE_WORDS:
        return False
    raise SettingError(f"{name}={text!r}: expected true or false (or 1/0, yes/no, on/off)")


def envbool(name: str, default: bool | str = False) -> bool:
    """$NAME as a boolean; the default may be written as a bool or as a spelling ("True")."""
    if isinstance(default, str):
        default = parse_bool(f"the default of {name}", default, False)
    return parse_bool(name, env(name), default)


def envint(name: str, default: int) -> int:
    """$NAME as an int; unset or empty (a compose file's `${NAME:-}`) means the default."""
    value = env(name).strip()
    if not value:
        return default
    try:
        return int(value)
    except ValueError:
        raise SettingError(f"{name}={value!r}: expected a whole number") from None


def envfloat(name: str, default: float) -> float:
    """$NAME as a finite float; unset or empty means the default."""
    value = env(name).strip()
    if not value:
        return default
    try:
        number = float(value)
    except ValueError:
        number = math.nan
    if not math.isfinite(number):
        raise SettingError(f"{name}={value!r}: expected a number, e.g. 2.5")
    return number


def envlist(name: str, default: str = "") -> list[str]:
    """$NAME as a comma-separated list, blanks dropped."""
    return [item.strip() for item in env(name, default).split(",") if item.strip()]


def envnetworks(name: str, default: str = "") -> list[str]:
    """$NAME as a comma-separated list of networks (CIDR, or one address); a value that is not
    a network is a SettingError naming it."""
    networks = envlist(name, default)
    for net in networks:
        try:
            ipaddress.ip_network(net, strict=False)
        except ValueError as exc:
            raise SettingError(f"{name}: {net!r} is not a network: {exc}") from None
    return networks


def url_with_password(name: str, url: str, password: str) -> str:
    """The URL $NAME with ``password`` (read apart from it, e.g. from a compose secret) put into
    it, quoted; a URL that carries a password already may not get a second one. No password:
    the URL as it is."""
    if not url or not password:
        return url
    parts = urlsplit(url)
    if parts.password is not None:
        raise SettingError(f"{name} has a password and one is given apart too: give one of them")
    user = quote(parts.username or "", safe="")
    netloc = f"{user}:{quote(password, safe='')}@{parts.netloc.rpartition('@')[2]}"
    return urlunsplit(parts._replace(netloc=netloc))


def envimagesources(name: str) -> list[str]:
    """$NAME as a comma-separated list of container image sources (agents.images: a transport,
    host and repository prefix, or a directory); one that is not is a SettingError naming it."""
    sources = envlist(name)
    for source in sources:
        try:
            source_parse(source)
        except ImageError as exc:
            raise SettingError(f"{name}: {source!r} is not an image source: {exc}") from None
    return sources


def envrange(name: str, default: str, *, low: int, high: int) -> tuple[int, int]:
    """$NAME as "FIRST-LAST", two whole numbers with low <= FIRST <= LAST <= high."""
    value = env(name, default).strip() or default
    first, sep, last = value.partition("-")
    try:
        bounds = (int(first), int(last)) if sep else None
    except ValueError:
        bounds = None
    if bounds is None or not low <= bounds[0] <= bounds[1] <= high:
        raise SettingError(
            f"{name}={value!r}: expected FIRST-LAST within {low}-{high}, e.g. {default}"
        )
    return bounds
