"""Containers: the pinned launch line of each runtime, and a real run through Podman (runc)."""

import json
import os
import shutil
import subprocess
import zlib
from pathlib import Path

import pytest

from agents.container_trial import rootfs_tar
from agents.containers import BadImage, NoRuntime, container_launch, detect_runtimes
from agents.protocol import image_runtimes
from tests.agents.test_agent_dispatch import _event, _gpu_uuids, _kinds, _outputs

ENV = {"CUDA_VISIBLE_DEVICES": "GPU-a,GPU-b", "GPU_PORTAL_BOOKING_ID": "7", "PATH": "/usr/bin"}
COMMON = dict(
    booking_id=7,
    command="python train.py",
    device_uuids=["GPU-a", "GPU-b"],
    uid=1001,
    gid=1002,
    env=ENV,
    workdir="/home/ann",
)


@pytest.mark.parametrize(
    ("image", "runtimes"),
    [
        (
            "docker://nvcr.io/nvidia/pytorch:24.05-py3",
            ("podman", "docker", "apptainer", "singularity"),
        ),
        ("nvcr.io/nvidia/pytorch:24.05-py3", ("podman", "docker", "apptainer", "singularity")),
        ("/shared/images/torch.sif", ("apptainer", "singularity")),
        ("oras://registry.example.org/torch:1", ("apptainer", "singularity")),
        ("library://lolcow", ("apptainer", "singularity")),
    ],
)
def test_it_knows_which_runtimes_can_run_an_image(image, runtimes):
    assert image_runtimes(image) == runtimes


def test_it_pins_the_podman_launch_line(monkeypatch):
    monkeypatch.setattr(os, "geteuid", lambda: 1001)  # rootless, as the job's user
    launch = container_launch(
        runtimes=["podman", "apptainer"],
        image="docker://nvcr.io/nvidia/pytorch:24.05-py3",
        extra_args={"podman": ["--network", "none"]},
        **COMMON,
    )
    assert launch.runtime == "podman" and launch.env == {}
    assert launch.argv == [
        "podman", "run", "--rm", "--init", "--name", "gpu-portal-7",
        "--user", "1001:1002", "--userns=keep-id",
        "--workdir", "/home/ann", "--volume", "/home/ann:/home/ann",
        "--env", "CUDA_VISIBLE_DEVICES", "--env", "GPU_PORTAL_BOOKING_ID",
        "--env", "NVIDIA_VISIBLE_DEVICES=GPU-a,GPU-b",
        "--device", "nvidia.com/gpu=GPU-a", "--device", "nvidia.com/gpu=GPU-b",
        "--network", "none",
        "nvcr.io/nvidia/pytorch:24.05-py3", "/bin/sh", "-c", "python train.py",
    ]  # fmt: skip


def test_it_pins_the_docker_launch_line():
    launch = container_launch(
        runtimes=["docker"], image="nvcr.io/nvidia/pytorch:24.05-py3", **COMMON
    )
    assert launch.argv == [
        "docker", "run", "--rm", "--init", "--name", "gpu-portal-7",
        "--user", "1001:1002",
        "--workdir", "/home/ann", "--volume", "/home/ann:/home/ann",
        "--env", "CUDA_VISIBLE_DEVICES", "--env", "GPU_PORTAL_BOOKING_ID",
        "--env", "NVIDIA_VISIBLE_DEVICES=GPU-a,GPU-b",
        "--device", "nvidia.com/gpu=GPU-a", "--device", "nvidia.com/gpu=GPU-b",
        "nvcr.io/nvidia/pytorch:24.05-py3", "/bin/sh", "-c", "python train.py",
    ]  # fmt: skip


@pytest.mark.parametrize(
    ("runtime", "image"), [("podman", "localhost/tiny:1"), ("apptainer", "/shared/torch.sif")]
)
def test_it_gives_a_container_no_devices_when_told_they_are_simulated(runtime, image):
    launch = container_launch(runtimes=[runtime], image=image, inject_devices=False, **COMMON)
    assert not [arg for arg in launch.argv if "nvidia.com/gpu" in arg or arg.startswith("--nv")]
    assert "NVIDIA_VISIBLE_DEVICES" not in launch.env
    # The job still learns its booked devices: CUDA_VISIBLE_DEVICES goes in as always.
    assert (
        "CUDA_VISIBLE_DEVICES" in launch.argv or "APPTAINERENV_CUDA_VISIBLE_DEVICES" in launch.env
    )


@pytest.mark.parametrize("runtime", ["podman", "docker"])
@pytest.mark.parametrize(
    ("inject", "devices"), [(True, "GPU-a,GPU-b"), (False, "void")], ids=["booked", "simulated"]
)
def test_it_names_the_containers_devices_over_the_images_and_the_bookings(runtime, inject, devices):
    """A CUDA image says NVIDIA_VISIBLE_DEVICES=all and an NVIDIA hook reads it: the launch line
    names the booked devices (or none) itself, and passes no such variable from the job's env."""
    common = {**COMMON, "env": {**COMMON["env"], "NVIDIA_VISIBLE_DEVICES": "all"}}
    launch = container_launch(
        runtimes=[runtime], image="localhost/tiny:1", inject_devices=inject, **common
    )
    named = [launch.argv[i + 1] for i, arg in enumerate(launch.argv) if arg == "--env"]
    assert [n for n in named if n.startswith("NVIDIA_VISIBLE_DEVICES")] == [
        f"NVIDIA_VISIBLE_DEVICES={devices}"
    ]


@pytest.mark.parametrize("runtime", ["apptainer", "singularity"])
def test_it_pins_the_apptainer_and_singularity_launch_lines(runtime):
    launch = container_launch(runtimes=[runtime], image="/shared/torch.sif", **COMMON)
    assert launch.argv == [
        runtime, "exec", "--nv", "--nvccli", "--cleanenv", "--pwd", "/home/ann",
        "/shared/torch.sif", "/bin/sh", "-c", "python train.py",
    ]  # fmt: skip
    prefix = runtime.upper() + "ENV_"
    assert launch.env == {
        **{prefix + name: value for name, value in ENV.items()},
        "NVIDIA_VISIBLE_DEVICES": "GPU-a,GPU-b",
    }


def test_it_refuses_an_image_no_runtime_of_the_node_can_run():
    with pytest.raises(NoRuntime, match="needs apptainer or singularity; this node has podman"):
        container_launch(runtimes=["podman"], image="/shared/torch.sif", **COMMON)


@pytest.mark.parametrize(
    "image",
    ["/shared/images/../../scratch/evil.sif", "nvcr.io/nvidia/../x", "nvcr.io@evil", "a b"],
)
def test_it_refuses_to_launch_what_is_no_image_reference(image):
    with pytest.raises(BadImage, match="is not an image reference"):
        container_launch(runtimes=["podman", "apptainer"], image=image, **COMMON)


@pytest.mark.parametrize(
    ("runtime", "image", "given"),
    [
        ("podman", "ubuntu:22.04", "docker.io/library/ubuntu:22.04"),
        ("docker", "docker://pytorch/pytorch", "docker.io/pytorch/pytorch"),
        ("apptainer", "nvcr.io/nvidia/pytorch:1", "docker://nvcr.io/nvidia/pytorch:1"),
        ("apptainer", "/shared//images/./torch.sif", "/shared/images/torch.sif"),
    ],
)
def test_it_gives_the_runtime_the_image_as_parsed(runtime, image, given):
    """The full name (no short-name search among the node's registries picks another one),
    a transport for Apptainer (a plain reference would be a file path to it), a clean path."""
    launch = container_launch(runtimes=[runtime], image=image, **COMMON)
    assert launch.argv[-4] == given


def test_it_reports_the_runtimes_it_finds_installed():
    assert detect_runtimes(lambda name: name in {"docker", "apptainer"}) == ["docker", "apptainer"]


def test_it_reports_a_booking_whose_image_it_cannot_run_as_not_launched(
    portal, make_agent, cycle_until, me
):
    agent = make_agent(container_runtimes=[])
    portal.book(3, me, _gpu_uuids(agent)[:1], command="true", image="docker://busybox")
    cycle_until(agent, lambda: ("exited", 3) in _kinds(portal))
    assert _event(portal, "exited", 3).detail.startswith("not launched: image 'docker://busybox'")


def test_it_reports_a_booking_whose_image_is_no_reference_as_not_launched(
    portal, make_agent, cycle_until, me
):
    agent = make_agent(container_runtimes=["podman"])
    portal.book(4, me, _gpu_uuids(agent)[:1], command="true", image="nvcr.io/x/../y")
    cycle_until(agent, lambda: ("exited", 4) in _kinds(portal))
    detail = _event(portal, "exited", 4).detail
    assert detail.startswith("not launched: image 'nvcr.io/x/../y' is not an image reference")


# -- a real run through Podman with runc ------------------------------------------------------

PODMAN_ARGS = [
    "--runtime", "/usr/sbin/runc", "--network", "none",
    "--ulimit", "nofile=1024:1024", "--ulimit", "nproc=4096:4096",
]  # fmt: skip
PROGRAMS = ["/bin/sh", "/usr/bin/env", "/usr/bin/id", "/bin/cat", "/bin/sleep", "/bin/pwd"]
TAG = f"localhost/gpu-portal-test:{zlib.crc32(str(Path(__file__).resolve()).encode()):08x}"


@pytest.fixture(scope="module")
def image(tmp_path_factory):
    """A tiny OCI image made with `podman import` from the host's shell and coreutils."""
    if not shutil.which("podman") or not Path("/usr/sbin/runc").exists():
        pytest.skip("needs podman and runc (apt-get install podman runc)")
    if os.geteuid() != 0:
        pytest.skip("the test writes a CDI spec under /var/run/cdi")
    tarball = tmp_path_factory.mktemp("rootfs") / "rootfs.tar"
    rootfs_tar(PROGRAMS, tarball)
    subprocess.run(["podman", "import", str(tarball), TAG], check=True, capture_output=True)
    yield TAG
    subprocess.run(["podman", "rmi", "-f", TAG], capture_output=True)


@pytest.fixture
def cdi_gpus():
    """A CDI spec naming simulated GPUs by UUID, as `nvidia-ctk --device-name-strategy=uuid`
    names real ones; each injects a variable, so the job shows which devices it got."""
    paths = []

    def write(uuids: list[str]) -> None:
        spec = {
            "cdiVersion": "0.5.0",
            "kind": "nvidia.com/gpu",
            "devices": [
                {"name": uuid, "containerEdits": {"env": [f"CDI_DEVICE_{i}={uuid}"]}}
                for i, uuid in enumerate(uuids)
            ],
        }
        path = Path("/var/run/cdi") / f"gpu-portal-test-{zlib.crc32(uuids[0].encode()):08x}.json"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(spec))
        paths.append(path)

    yield write
    for path in paths:
        path.unlink(missing_ok=True)


def _podman_agent(make_agent, cdi_gpus):
    agent = make_agent(container_runtimes=["podman"], container_args={"podman": PODMAN_ARGS})
    uuids = _gpu_uuids(agent)
    cdi_gpus(uuids)
    return agent, uuids


def test_it_runs_the_command_in_the_image_with_only_the_booked_devices(
    portal, make_agent, cycle_until, me, image, cdi_gpus
):
    agent, (gpu0, gpu1) = _podman_agent(make_agent, cdi_gpus)
    show = "id -u; pwd; echo booking=$GPU_PORTAL_BOOKING_ID cvd=$CUDA_VISIBLE_DEVICES"
    show += "; echo cdi0=$CDI_DEVICE_0 cdi1=$CDI_DEVICE_1"
    portal.book(11, me, [gpu1], command=show, image=image)
    cycle_until(agent, lambda: ("exited", 11) in _kinds(portal), timeout_s=60)
    exited = _event(portal, "exited", 11)
    assert exited.exit_code == 0, exited.log_tail
    uid, workdir, ids, devices = exited.log_tail.splitlines()
    # The booking's working directory (the stand-in portal gives one), inside the container too.
    assert uid == str(os.geteuid()) and workdir == portal.workdir
    assert ids == f"booking=11 cvd={gpu1}"
    assert devices == f"cdi0= cdi1={gpu1}"  # the booked GPU only: gpu0's edit is absent


def test_it_sends_the_stop_signal_through_the_runtime_to_the_command(
    portal, make_agent, cycle_until, me, image, cdi_gpus
):
    agent, (gpu0, _) = _podman_agent(make_agent, cdi_gpus)
    job = "trap 'echo got TERM; exit 0' TERM; echo ready; while :; do sleep 0.2; done"
    portal.book(12, me, [gpu0], command=job, image=image)
    cycle_until(agent, lambda: any("ready" in t for t in _outputs(portal, 12)), timeout_s=60)
    portal.desired["bookings"].clear()
    cycle_until(agent, lambda: ("stopped", 12) in _kinds(portal), timeout_s=60)
    stopped = _event(portal, "stopped", 12)
    assert "got TERM" in stopped.log_tail
    assert stopped.exit_code == 0  # it exited on TERM, within the grace: no SIGKILL


def test_it_removes_a_container_that_ignored_the_stop_signal(
    portal, make_agent, cycle_until, me, image, cdi_gpus
):
    agent, (gpu0, _) = _podman_agent(make_agent, cdi_gpus)
    job = "trap '' TERM; echo ready; while :; do sleep 0.2; done"
    portal.book(13, me, [gpu0], command=job, image=image)
    cycle_until(agent, lambda: any("ready" in t for t in _outputs(portal, 13)), timeout_s=60)
    portal.desired["bookings"].clear()
    cycle_until(agent, lambda: ("stopped", 13) in _kinds(portal), timeout_s=60)
    left = subprocess.run(
        ["podman", "ps", "--all", "--quiet", "--filter", "name=^gpu-portal-13$"],
        capture_output=True,
        text=True,
    )
    assert left.stdout.strip() == ""  # killed client, and its container removed too


def test_it_runs_a_container_on_simulated_gpus_with_no_cdi_spec_when_told_not_to_inject(
    portal, make_agent, cycle_until, me, image
):
    # What `up` gives its demo agents (--no-container-devices): no CDI spec names the simulated
    # GPUs, so a --device for them would fail the launch.
    agent = make_agent(
        container_runtimes=["podman"],
        container_args={"podman": PODMAN_ARGS},
        container_devices=False,
    )
    gpu = _gpu_uuids(agent)[0]
    portal.book(14, me, [gpu], command="echo cvd=$CUDA_VISIBLE_DEVICES", image=image)
    cycle_until(agent, lambda: ("exited", 14) in _kinds(portal), timeout_s=60)
    exited = _event(portal, "exited", 14)
    assert exited.exit_code == 0, exited.log_tail
    assert exited.log_tail.strip() == f"cvd={gpu}"


def test_it_holds_a_podman_container_to_the_bookings_cores_and_memory(
    portal, make_agent, cycle_until, me, image
):
    # Podman puts the container in its own cgroups (v1 here): the limits come as run options,
    # and the container reads them back from its cgroup.
    agent = make_agent(
        container_runtimes=["podman"],
        container_args={"podman": PODMAN_ARGS},
        container_devices=False,
    )
    gpu = _gpu_uuids(agent)[0]
    show = (
        "cat /sys/fs/cgroup/memory/memory.limit_in_bytes /sys/fs/cgroup/cpuset/cpuset.cpus "
        "/sys/fs/cgroup/cpu/cpu.cfs_quota_us; echo cpus=$GPU_PORTAL_CPUS"
    )
    portal.book(15, me, [gpu], command=show, image=image, cpus=1, memory_mib=64)
    cycle_until(agent, lambda: ("exited", 15) in _kinds(portal), timeout_s=60)
    exited = _event(portal, "exited", 15)
    assert exited.exit_code == 0, exited.log_tail
    core = _event(portal, "started", 15).detail.split("core(s) ")[1].split()[0]
    assert exited.log_tail.split() == [str(64 << 20), core, "100000", "cpus=1"]
