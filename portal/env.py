"""Small helpers for reading settings from the environment (secrets may come from NAME_FILE).

A value that does not parse is a SettingError naming the variable, the value and what was
expected: a typo (``DEBUG=ture``) stops the start instead of quietly meaning something else.
Unset or empty (a compose file's ``${NAME:-}``) means the default.
"""

import ipaddress
import math
import os
import sys
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


def envint(name: str, default: int, *, low: int | None = None, high: int | None = None) -> int:
    """$NAME as a whole number within [low, high]; unset or empty (a compose file's `${NAME:-}`)
    means the default."""
    value = env(name).strip()
    if not value:
        return default
    try:
        number = int(value) if value.isascii() else None
    except ValueError:
        number = None
    if number is None or not _within(number, low, high):
        raise SettingError(f"{name}={value!r}: expected a whole number{_bounds(low, high)}")
    return number


def envfloat(
    name: str, default: float, *, low: float | None = None, high: float | None = None
) -> float:
    """$NAME as a finite number within [low, high]; unset or empty means the default."""
    value = env(name).strip()
    if not value:
        return default
    try:
        number = float(value) if value.isascii() else math.nan
    except ValueError:
        number = math.nan
    if not math.isfinite(number) or not _within(number, low, high):
        raise SettingError(
            f"{name}={value!r}: expected a number{_bounds(low, high)}, e.g. {_number(default)}"
        )
    return number


def _within(number: float, low: float | None, high: float | None) -> bool:
    return (low is None or number >= low) and (high is None or number <= high)


def _bounds(low: float | None, high: float | None) -> str:
    if low is not None and high is not None:
        return f" from {_number(low)} to {_number(high)}"
    if low is not None:
        return f" of at least {_number(low)}"
    return f" of at most {_number(high)}" if high is not None else ""


def _number(x: float) -> str:
    return str(int(x)) if float(x).is_integer() else repr(float(x))


def envchoice(name: str, default: str, choices: tuple[str, ...], *, upper: bool = False) -> str:
    """$NAME as one of ``choices`` (compared upper-cased with ``upper``); blank is the default."""
    value = env(name).strip()
    if not value:
        return default
    word = value.upper() if upper else value
    if word not in choices:
        raise SettingError(f"{name}={value!r}: expected one of {', '.join(choices)}")
    return word


def envurl(
    name: str, default: str, *, schemes: tuple[str, ...], host_or_path: tuple[str, ...] = ()
) -> str:
    """$NAME as a URL of one of ``schemes`` with a host (for the ``host_or_path`` schemes, such
    as sqlite:// and unix://, a host or a path) and a valid port; blank is the default."""
    value = env(name).strip()
    if not value:
        return default
    problem = url_problem(value, schemes=schemes, host_or_path=host_or_path)
    if problem:
        raise SettingError(f"{name}={_shown(value)!r}: {problem}")
    return value


def url_problem(value: str, *, schemes: tuple[str, ...], host_or_path: tuple[str, ...] = ()) -> str:
    """Why ``value`` is not such a URL, or "" when it is."""
    starts = [f"{scheme}://" for scheme in schemes]
    either = ", ".join(starts[:-1]) + " or " + starts[-1] if len(starts) > 1 else starts[0]
    expected = f"expected a URL starting with {either}"
    try:
        parts = urlsplit(value)
        parts.port  # noqa: B018 (raises on a port that is no number or out of range)
    except ValueError as exc:
        return f"{expected} ({exc})"
    if parts.scheme not in schemes or not value.startswith(f"{parts.scheme}://"):
        return expected
    if any(ord(c) < 33 or ord(c) == 127 for c in value):
        return f"{expected}, without spaces or control characters"
    if parts.scheme in host_or_path:
        return "" if parts.path or parts.netloc else f"{expected} with a host or a path"
    return "" if parts.hostname else f"{expected} with a host"


def _shown(url: str) -> str:
    """The URL with any password replaced, for an error message."""
    parts = urlsplit(url)
    try:
        password = parts.password
    except ValueError:
        password = None
    return url.replace(f":{password}@", ":***@", 1) if password else url


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


def settings_or_exit() -> None:
    """Load the settings now; a bad one ends the process with one line on stderr,
    ``Bad setting: <variable>...``, and exit status 1. Every entry point (manage.py, the ASGI
    and WSGI applications, the Celery app) calls it before Django reads its settings."""
    from django.conf import settings

    try:
        settings.INSTALLED_APPS  # noqa: B018
    except SettingError as error:
        sys.exit("Bad setting: " + " ".join(str(error).split()))
