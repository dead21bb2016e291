"""`python -m agents check` on the simulated backend: a good node passes, a broken one is
explained line by line and its exit status names what failed."""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from agents import check
from tests.agents.conftest import TOKEN
from tests.agents.test_agent_containers import PODMAN_ARGS

ROOT = Path(__file__).resolve().parents[2]
SPEC = "2xH100-80GB,1xA100-80GB:mig=3g.40gb+2g.20gb"


def _check(*args: str, env=None, containers=("--no-containers",)) -> subprocess.CompletedProcess:
    """The check; `containers` are its container options (none by default: whatever runtimes
    this machine has do not decide the other checks' results)."""
    return subprocess.run(
        [sys.executable, "-m", "agents", "check", "--simulate", SPEC, *containers, *args],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env=env,
        timeout=60,
    )


def _line(output: str, name: str) -> str:
    """The check's summary line: `[status] name: ...`."""
    (line,) = [
        line
        for line in output.splitlines()
        if line.startswith("[") and line.split("]", 1)[1].strip().startswith(f"{name}:")
    ]
    return line


def test_it_passes_a_simulated_node_that_reaches_its_portal(portal, tmp_path, me):
    user_map = tmp_path / "users.json"
    user_map.write_text(json.dumps({"alice": me}))
    result = _check(
        "--hostname",
        "gpu-new-01",
        "--portal",
        portal.url,
        "--token",
        TOKEN,
        "--user-map",
        str(user_map),
        "--min-uid",
        "0",
        "--session-host",
        "127.0.0.1",
        "--confine",
        "off",
    )

    assert result.returncode == 0, result.stdout + result.stderr
    out = result.stdout
    assert out.startswith("GPU Portal agent check on gpu-new-01\n")
    assert _line(out, "nvml").startswith("[ok]") and "3 GPU(s), 2 MIG instance(s)" in out
    assert "NVIDIA A100-80GB" in out and "3g.40gb (3 slices, 40960 MiB)  MIG-" in out
    assert _line(out, "reading").startswith("[ok]") and "5 device(s) read" in out
    assert "[ok]   portal: " in out and "token accepted (0 active booking(s))" in out
    assert f"alice -> {me} (uid {os.geteuid()})" in out
    assert _line(out, "confinement").startswith("[ok]")
    assert _line(out, "session host").startswith("[warn]") and "loopback" in out
    assert out.rstrip().endswith("exit 0: all passed")


def test_it_explains_a_broken_node_and_sums_the_failures_in_its_exit_status(portal, tmp_path):
    user_map = tmp_path / "users.json"
    user_map.write_text(json.dumps({"alice": "no-such-unix-user"}))
    result = _check(
        "--portal",
        portal.url,
        "--token",
        "not-the-token",
        "--user-map",
        str(user_map),
        "--session-host",
        "192.0.2.1",
    )

    out = result.stdout
    assert result.returncode == 32 + 64 + 128, out
    assert _line(out, "portal").startswith("[fail]") and "refused the token" in out
    assert "[fail] session host: 192.0.2.1: not an address of this node" in out
    assert "alice -> no-such-unix-user: no such Unix user" in out
    assert out.rstrip().endswith("exit 224: failed session host, portal, user map")


def test_it_fails_nvml_when_there_are_no_gpus_to_read():
    result = _check("--simulate", "8xNOT-A-GPU")  # the last --simulate wins
    assert result.returncode == 4
    assert "[fail] nvml: cannot read the GPUs:" in result.stdout
    assert "[skip] reading: no GPU to read" in result.stdout


def test_it_fails_when_the_portal_does_not_answer():
    result = _check("--portal", "http://127.0.0.1:9", "--token", TOKEN)
    assert result.returncode == 64
    assert "http://127.0.0.1:9 does not answer" in result.stdout


def test_it_lists_the_container_runtimes_on_path(tmp_path, monkeypatch):
    for name in ("podman", "apptainer"):
        tool = tmp_path / name
        tool.write_text("#!/bin/sh\n")
        tool.chmod(0o755)
    monkeypatch.setenv("PATH", str(tmp_path))
    assert check.container_runtimes() == {
        "apptainer": str(tmp_path / "apptainer"),
        "podman": str(tmp_path / "podman"),
    }
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    (found,) = check.check_runtimes()
    assert found.summary == "none found (podman, docker, apptainer, singularity)"


def _runs_podman():
    if not shutil.which("podman") or not Path("/usr/sbin/runc").exists():
        pytest.skip("needs podman and runc (apt-get install podman runc)")


def test_it_fails_a_docker_client_whose_daemon_does_not_answer():
    if not shutil.which("docker"):
        pytest.skip("needs a docker client")
    if subprocess.run(["docker", "info"], capture_output=True, timeout=60).returncode == 0:
        pytest.skip("docker's daemon answers here")
    result = _check(containers=("--container-runtime", "docker"))
    line = _line(result.stdout, "docker")
    assert line.startswith("[fail] docker: cannot run a container: "), result.stdout
    assert "daemon" in line.lower()  # docker's own reason: it cannot connect to the daemon
    assert result.returncode == 1, result.stdout
    assert result.stdout.rstrip().endswith("exit 1: failed docker")


def test_it_fails_podman_whose_oci_runtime_does_not_work():
    _runs_podman()
    missing = "podman=--runtime=/nonexistent/runc"
    result = _check(containers=("--container-runtime", "podman", "--container-arg", missing))
    line = _line(result.stdout, "podman")
    assert line.startswith(
        "[fail] podman: cannot run a container (with --runtime=/nonexistent/runc)"
    )
    assert "/nonexistent/runc" in line.split(": ", 2)[2]  # podman's reason names it
    assert result.returncode == 1


def test_it_passes_podman_that_runs_a_container_with_the_sites_options():
    _runs_podman()
    # The options podman needs on this machine, as the real-run tests give them to the agent.
    options = [word for arg in PODMAN_ARGS for word in ("--container-arg", f"podman={arg}")]
    result = _check(containers=("--container-runtime", "podman", *options))
    assert _line(result.stdout, "podman").startswith("[ok]   podman: runs a trivial container")
    assert result.returncode == 0, result.stdout


def test_it_counts_failing_runtimes_once_in_the_exit_status():
    failed = [check.Result(name, "fail", "x") for name in ("podman", "docker", "portal")]
    assert check.exit_status(failed) == 1 + 64


def test_it_prints_the_topology_it_reads():
    result = _check("--simulate", "8xV100-32GB@cube-mesh")
    assert "8 GPU(s), NVLink on 8" in _line(result.stdout, "nvml")
    assert "topology: PCI 0000:18:00.0, NUMA node 0, NVLink to GPU 1, 2, 3, 4" in result.stdout
    result = _check("--simulate", "8xL40S-48GB@pcie")
    assert "8 GPU(s), no NVLink" in _line(result.stdout, "nvml")
    assert "topology: PCI 0000:1f:00.0, NUMA node 1, no NVLink (PCIe only)" in result.stdout
    result = _check()
    assert "topology: not reported" in result.stdout


def test_it_reports_whether_mps_is_there_for_shared_gpus():
    found = check.check_mps(False, which=lambda name: f"/usr/bin/{name}")
    assert (found.status, found.summary) == (
        "ok",
        "nvidia-cuda-mps-control at /usr/bin/nvidia-cuda-mps-control; available (the agent's --mps)",
    )
    missing = check.check_mps(False, which=lambda name: None)
    assert missing.status == "skip" and "memory watch alone" in missing.summary
    wanted = check.check_mps(True, which=lambda name: None)
    assert (wanted.status, wanted.summary) == (
        "fail",
        "--mps, but no nvidia-cuda-mps-control on PATH",
    )
    assert check.exit_status([wanted]) == 4  # with nvml's bit: the GPU stack


def test_it_fails_a_node_meant_for_mps_without_the_mps_binary():
    result = _check("--mps", "--confine", "off", "--session-host", "127.0.0.1")
    assert _line(result.stdout, "mps").startswith("[fail]")
    assert result.returncode == 4, result.stdout
