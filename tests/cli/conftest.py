"""Fixtures for the command-line client: a live portal and `gpu-portal` run as a subprocess."""

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from portal.models import ApiToken
from portal.models.tokens import hash_token, new_token
from tests.factories import (
    ProjectFactory,
    QuotaFactory,
    UserFactory,
    make_mig_gpu,
    make_node,
    member,
)

ROOT = Path(__file__).resolve().parents[2]


def token_for(user) -> str:
    """A fresh API token for `user`, as `gpu-portal login` would get one."""
    raw = new_token("gp")
    ApiToken.objects.create(user=user, name="test", key_hash=hash_token(raw), prefix=raw[:10])
    return raw


@pytest.fixture
def site(transactional_db):
    """alice in project vision (at most 3 GPUs at once); a node of 2 A100s and one MIG GPU."""
    alice = UserFactory(username="alice")
    vision = ProjectFactory(slug="vision")
    member(alice, vision)
    QuotaFactory(project=vision, max_gpus=3)
    node = make_node("cli-a", gpus=2)
    make_mig_gpu(node, 2)
    return {"alice": alice, "project": vision, "node": node}


@pytest.fixture
def cli(live_server, tmp_path):
    """Run `gpu-portal ARGS` against the live server: a CompletedProcess (text). `token=` sets
    GPU_PORTAL_TOKEN; the config file lives in a fresh XDG_CONFIG_HOME."""
    home = tmp_path / "home"
    home.mkdir()

    def environment(token: str | None, url: str | None) -> dict:
        env = {k: v for k, v in os.environ.items() if not k.startswith(("GPU_PORTAL_", "DJANGO"))}
        env |= {
            "HOME": str(home),
            "XDG_CONFIG_HOME": str(home / ".config"),
            "GPU_PORTAL_URL": url or live_server.url,
            "TZ": "UTC",
        }
        if token is not None:
            env["GPU_PORTAL_TOKEN"] = token
        return env

    def run(*args: str, token: str | None = None, stdin: str = "", url=None, timeout=60):
        return subprocess.run(
            [sys.executable, "-m", "portal.cli", *args],
            input=stdin,
            capture_output=True,
            text=True,
            env=environment(token, url),
            cwd=ROOT,
            timeout=timeout,
        )

    def start(*args: str, token: str | None = None):
        """The command running in the background (a Popen with text pipes), interruptible as
        from a terminal: a suite started in the background (`.ci/run &`) ignores SIGINT, and
        Python keeps an inherited SIG_IGN, so Ctrl-C would never reach it."""
        return subprocess.Popen(
            [sys.executable, "-m", "portal.cli", *args],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=environment(token, None),
            cwd=ROOT,
            preexec_fn=_interruptible,
        )

    run.home = home
    run.start = start
    return run


def _interruptible() -> None:
    signal.signal(signal.SIGINT, signal.SIG_DFL)
