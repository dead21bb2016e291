"""Containers in the demo: `manage.py up` with the documented settings (CONTAINER_IMAGE_SOURCES,
DEMO_AGENT_ARGS) runs a batch job in a container image through Podman on simulated GPUs."""

import os
import shutil
import subprocess
import zlib
from pathlib import Path

import pytest
from django.core.management.base import CommandError

from agents.container_trial import rootfs_tar
from portal.management.commands.up import demo_agent_args
from portal.services.reporting.demo import DEMO_PASSWORD
from tests.agents.test_agent_containers import PODMAN_ARGS
from tests.portal.test_demo_and_up import ROOT, _json, _wait, embedded_portal  # noqa: F401

SOURCE = "localhost/gpu-portal-demo-test"
TAG = f"{SOURCE}:{zlib.crc32(str(Path(__file__).resolve()).encode()):08x}"


@pytest.mark.parametrize(
    ("value", "says"),
    [
        ("--hostname gpu-x", "DEMO_AGENT_ARGS: up sets --hostname itself"),
        ("--portal=http://elsewhere", "DEMO_AGENT_ARGS: up sets --portal itself"),
        ("--no-such-option", "DEMO_AGENT_ARGS: unrecognized arguments: --no-such-option"),
        ("--container-arg 'podman=--runtime", "DEMO_AGENT_ARGS: No closing quotation"),
        ("--container-runtime rkt", "DEMO_AGENT_ARGS: argument --container-runtime"),
        ("x" * 5000, "DEMO_AGENT_ARGS: at most 4096 characters"),
    ],
)
def test_it_refuses_demo_agent_args_it_cannot_pass_naming_the_setting(settings, value, says):
    settings.DEMO_AGENT_ARGS = value
    with pytest.raises(CommandError) as refused:
        demo_agent_args()
    assert str(refused.value).startswith(says)


def test_it_passes_the_demo_agent_args_as_shell_words(settings):
    settings.DEMO_AGENT_ARGS = "--container-runtime podman --container-arg 'podman=--network none'"
    assert demo_agent_args() == [
        "--container-runtime", "podman", "--container-arg", "podman=--network none",
    ]  # fmt: skip


def _documented_agent_args() -> str:
    """DEMO_AGENT_ARGS as docs/containers.md gives it for this machine's Podman."""
    text = (ROOT / "docs" / "containers.md").read_text()
    (line,) = [line for line in text.splitlines() if line.startswith("DEMO_AGENT_ARGS=")]
    value = line.removeprefix("DEMO_AGENT_ARGS=").split(" \\")[0].strip("'\"")
    # The docs give the options PODMAN_ARGS are: the real-run tests' own.
    assert [a.removeprefix("podman=") for a in value.split() if a.startswith("podman=")] == [
        f"{flag}={value}" for flag, value in zip(PODMAN_ARGS[::2], PODMAN_ARGS[1::2], strict=True)
    ]
    return value


@pytest.fixture
def demo_image(tmp_path):
    if not shutil.which("podman") or not Path("/usr/sbin/runc").exists():
        pytest.skip("needs podman and runc (apt-get install podman runc)")
    if os.geteuid() != 0:
        pytest.skip("the demo's jobs run as whoever runs up: rootful Podman here")
    tarball = tmp_path / "rootfs.tar"
    rootfs_tar(["/bin/sh", "/bin/cat", "/usr/bin/id"], tarball)
    subprocess.run(["podman", "import", str(tarball), TAG], check=True, capture_output=True)
    yield TAG
    subprocess.run(["podman", "rmi", "-f", TAG], capture_output=True)


@pytest.fixture
def container_settings(monkeypatch, demo_image):
    """The documented settings, in the environment `up` starts with (embedded_env copies it)."""
    monkeypatch.setenv("CONTAINER_IMAGE_SOURCES", SOURCE)
    monkeypatch.setenv("DEMO_AGENT_ARGS", _documented_agent_args())


@pytest.mark.timeout(240)
def test_it_runs_a_container_batch_job_in_the_embedded_demo_through_podman(
    demo_image,
    container_settings,
    embedded_portal,  # noqa: F811 (the fixture imported above)
):
    base, _ = embedded_portal
    login = {"username": "bob", "password": DEMO_PASSWORD}
    token = _json(f"{base}/api/v1/auth/token/", login)["token"]
    _wait(
        lambda: all(
            n["state"] == "up" for n in _json(f"{base}/api/v1/nodes/", token=token)["results"]
        ),
        60,
        "the simulated nodes",
    )
    booking = _json(
        f"{base}/api/v1/bookings/",
        {
            "gpus": 1,
            "duration_s": 600,
            "image": demo_image,
            "command": "echo in the image: $(id -u) $CUDA_VISIBLE_DEVICES; "
            "cat /etc/os-release 2>/dev/null || echo no host files",
        },
        token,
    )
    url = f"{base}/api/v1/bookings/{booking['id']}/"
    done = _wait(
        lambda: (b := _json(url, token=token))["state"] in ("finished", "failed") and b,
        120,
        "the container job to run and exit",
    )
    assert done["state"] == "finished" and done["exit_code"] == 0, done
    # The image holds only a shell, cat and id: the host's /etc/os-release is not in it.
    assert done["log_tail"].splitlines() == [
        f"in the image: {os.geteuid()} {done['devices'][0]['uuid']}",
        "no host files",
    ], done["log_tail"]
