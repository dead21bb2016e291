"""Sizes the API takes as text: host memory as "64G", "512M", "1T" (units of 1024) or MiB.

The client (portal/cli/output.py) parses the same sizes on its own: it installs without the
portal, so it cannot import this. tests/cli/test_cli_shared.py runs both on one table, so the
command line and the API read every size alike.
"""

from __future__ import annotations

import re

_MEMORY = re.compile(r"([0-9]{1,10})(?:(k|m|g|t)(?:i?b)?)?\Z")
_UNITS_MIB = {"k": 1 / 1024, "m": 1, "g": 1024, "t": 1024 * 1024, None: 1}
MEMORY_MAX_MIB = 2**31 - 1


def parse_memory_mib(text: str) -> int:
    """MiB from '20G', '20GiB', '20GB', '512M', '1T' (units of 1024) or a bare number of MiB;
    ValueError naming the text otherwise."""
    match = _MEMORY.match(text.strip().lower())
    if not match:
        raise ValueError(f"'{text}' is not a memory size (try 20G or 512M)")
    mib = int(match.group(1)) * _UNITS_MIB[match.group(2)]
    if not 1 <= mib <= MEMORY_MAX_MIB or mib != int(mib):
        raise ValueError(f"'{text}' is not a whole number of MiB between 1 and {MEMORY_MAX_MIB}")
    return int(mib)
