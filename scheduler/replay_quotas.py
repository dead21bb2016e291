"""The replay's quota model: project limits over a trace's (synthetic) users.

A spec ``N x S`` (``4x0.25``) makes N projects, ``project-<crc32(user) % N>``, each with a
concurrency limit (``Quota.max_gpus``, the guaranteed share) of S x the cluster's GPUs; with
``borrowing`` the limits lend (``Quota.borrowing``, scheduler/borrowing.py). A job wider than its
project's limit is refused, as the portal refuses it at submission, and counted in
``quota_refused``. Traces carry no users (see ``replay.synthetic_user``): the projects are as
synthetic as the users.
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass

from scheduler.types import Quota

_MOST_PROJECTS = 1000


@dataclass(frozen=True)
class QuotaModel:
    """N projects over the users, each limited to ``share`` of the cluster's GPUs at once."""

    projects: int
    share: float
    borrowing: bool = False

    def project_of(self, user: str) -> str:
        """The documented rule: a user's project is its crc32 modulo the number of projects."""
        return f"project-{zlib.crc32(user.encode()) % self.projects}"

    def limit(self, capacity: int) -> float:
        """Each project's concurrency limit in GPUs."""
        return self.share * capacity

    def quotas(self, capacity: int) -> dict[str, Quota]:
        """The projects' quotas on a cluster of ``capacity`` GPUs."""
        limit = self.limit(capacity)
        return {
            f"project-{i}": Quota(max_gpus=limit, borrowing=self.borrowing)
            for i in range(self.projects)
        }

    @property
    def label(self) -> str:
        """ "4x0.25" (with "+borrowing" when the limits lend)."""
        return f"{self.projects}x{self.share:g}" + ("+borrowing" if self.borrowing else "")


def parse_quota_model(text: str, *, borrowing: bool = False) -> QuotaModel:
    """``"4x0.25"`` -> QuotaModel(4, 0.25); a ValueError naming what is wrong otherwise."""
    count, sep, share = text.strip().lower().partition("x")
    if not sep:
        raise ValueError(f"quota model {text!r}: expected PROJECTSxSHARE, e.g. 4x0.25")
    try:
        projects, fraction = int(count), float(share)
    except ValueError:
        raise ValueError(f"quota model {text!r}: expected PROJECTSxSHARE, e.g. 4x0.25") from None
    if not 1 <= projects <= _MOST_PROJECTS:
        raise ValueError(f"quota model {text!r}: projects must be 1 to {_MOST_PROJECTS}")
    if not 0 < fraction <= 1:
        raise ValueError(f"quota model {text!r}: the share must be in (0, 1]")
    return QuotaModel(projects, fraction, borrowing)
