"""A node's cores and memory: read from the machine or a simulated SPEC, reserved for the
system, and reported at register (agents/host.py, agents/simulate.py)."""

from __future__ import annotations

import os

import pytest

from agents import host, protocol
from agents.__main__ import build_parser
from agents.check import check_limits
from agents.limits import CgroupLimits
from agents.simulate import HostSpec, SpecError, parse_host, parse_spec


@pytest.mark.parametrize(
    ("spec", "cpus", "memory_mib", "gpus"),
    [
        ("8xH100-80GB,cpus=112,mem=2T@nvswitch", 112, 2 * 1024 * 1024, 8),
        ("8xH100-80GB,cpus=64,mem=1024G", 64, 1024 * 1024, 8),
        ("4xA100-80GB,4xA100-80GB:mig=3g.40gb+2g.20gb,mem=512G", None, 512 * 1024, 8),
        ("2xL40S-48GB", None, None, 2),
    ],
)
def test_it_reads_the_cores_and_memory_a_simulated_spec_names(spec, cpus, memory_mib, gpus):
    assert parse_host(spec) == HostSpec(cpus, memory_mib)
    assert len(parse_spec(spec)) == gpus


@pytest.mark.parametrize(
    ("spec", "says"),
    [
        ("8xH100-80GB,cpus=0", "cpus='0': a number of cores from 1 to 8192"),
        ("8xH100-80GB,cpus=8193", "a number of cores from 1 to 8192"),
        ("8xH100-80GB,cpus=" + "9" * 5000, "a number of cores from 1 to 8192"),
        ("8xH100-80GB,cpus=٣", "a number of cores"),  # ASCII digits only
        ("8xH100-80GB,mem=12X", "write a size such as 512M, 64G or 2T"),
        ("8xH100-80GB,mem=" + "9" * 40, "write a size"),
        ("8xH100-80GB,mem=0", "at least 1 MiB"),
        ("8xH100-80GB,mem=9999T", "at most 2147483647 MiB"),
        ("8xH100-80GB,gpus=3", "expected cpus=N or mem=SIZE"),
        ("8xH100-80GB,cpus=2,cpus=3", "cpus= is given twice"),
        ("cpus=4,mem=1G", "no GPU in SPEC"),
    ],
)
def test_it_refuses_a_bad_host_item_saying_which_and_why(spec, says):
    with pytest.raises(SpecError) as refused:
        parse_host(spec)
        parse_spec(spec)
    assert says in str(refused.value)


def test_it_reads_the_machines_cores_memory_and_numa_nodes(tmp_path):
    meminfo = tmp_path / "meminfo"
    meminfo.write_text("MemTotal:       24683520 kB\nMemFree:        1 kB\n")
    nodes = tmp_path / "node"
    mine = sorted(os.sched_getaffinity(0))
    for n, cores in enumerate([mine[:1], mine[1:]]):
        (nodes / f"node{n}").mkdir(parents=True)
        (nodes / f"node{n}" / "cpulist").write_text(host.format_cpulist(cores) + "\n")
    (nodes / "possible").write_text("0-1\n")  # not a node directory
    machine = host.read_machine(nodes, meminfo)
    assert machine.cpus == tuple(mine)
    assert machine.memory_mib == 24683520 // 1024
    assert machine.numa == ((0, tuple(mine[:1])), (1, tuple(mine[1:])))


def test_it_keeps_the_reserved_cores_and_memory_from_jobs():
    node = host.simulated(112, 2 * 1024 * 1024, numa_nodes=2)
    usable = host.reserve(node, cpus=2, memory_mib=4096)
    assert (len(usable.cpus), usable.cpus[0], usable.memory_mib) == (110, 2, 2 * 1024 * 1024 - 4096)
    assert [(n.numa_node, n.cpu_list) for n in usable.numa_cpus()] == [(0, "2-55"), (1, "56-111")]
    with pytest.raises(host.HostError, match="leaves no core for jobs"):
        host.reserve(node, cpus=112)
    with pytest.raises(host.HostError, match="leaves no memory for jobs"):
        host.reserve(node, memory_mib=2 * 1024 * 1024)


@pytest.mark.parametrize(
    ("text", "cores"),
    [("0-3,8,10-11", (0, 1, 2, 3, 8, 10, 11)), ("5", (5,)), ("", ()), ("3,1-2\n", (1, 2, 3))],
)
def test_it_reads_and_writes_cpulists(text, cores):
    assert host.parse_cpulist(text) == cores
    assert host.parse_cpulist(host.format_cpulist(cores)) == cores


@pytest.mark.parametrize(
    "text", ["0-8192", "3-1", "a", "1,,2", "0-" + "9" * 100, ",".join(["0-8191"] * 1000)]
)
def test_it_refuses_a_cpulist_it_cannot_bound(text):
    with pytest.raises(host.HostError):
        host.parse_cpulist(text)


def test_it_reports_the_spec_cores_and_memory_less_the_reserved_at_register(portal, make_agent):
    agent = make_agent(
        "2xH100-80GB,cpus=64,mem=1024G@pcie", reserved_cpus=2, reserved_memory_mib=4096
    )
    agent.handle_one_cycle()
    (sent,) = [b for _, p, b in portal.received if p == protocol.REGISTER_PATH]
    assert (sent.cpus, sent.memory_mib) == (62, 1024 * 1024 - 4096)
    assert [(n.numa_node, n.cpu_list) for n in sent.numa_cpus] == [(0, "2-31"), (1, "32-63")]


def test_it_reports_the_machines_own_cores_and_memory_without_them(portal, make_agent):
    agent = make_agent("1xH100-80GB")
    agent.handle_one_cycle()
    (sent,) = [b for _, p, b in portal.received if p == protocol.REGISTER_PATH]
    machine = host.read_machine()
    assert (sent.cpus, sent.memory_mib) == (len(machine.cpus), machine.memory_mib)


@pytest.mark.parametrize(
    ("option", "says"),
    [
        (["--reserved-memory", "4X"], "write a size such as 512M, 64G or 2T"),
        (["--reserved-cpus", "-1"], "is not a number of cores"),
    ],
)
def test_it_refuses_a_bad_reservation_at_start(option, says, capsys):
    with pytest.raises(SystemExit):
        build_parser().parse_args(["--portal", "http://x", *option])
    assert says in capsys.readouterr().err


def test_it_parses_the_reservations():
    args = build_parser().parse_args(
        ["--portal", "http://x", "--reserved-cpus", "2", "--reserved-memory", "4G"]
    )
    assert (args.reserved_cpus, args.reserved_memory) == (2, 4096)


@pytest.mark.skipif(os.geteuid() != 0, reason="the limits are only a root agent's")
def test_check_says_which_limits_a_cgroup_v2_node_enforces(tmp_path):
    (tmp_path / "cgroup.controllers").write_text("cpu io memory pids\n")  # no cpuset delegated
    result = check_limits("off", "gpu-a01", CgroupLimits(tmp_path, "gpu-a01"))
    assert (result.status, result.summary) == (
        "warn",
        f"cpu quota, memory limit by cgroup v2 under {tmp_path}",
    )
    assert result.details == ["cpuset: no", "cpu quota: yes", "memory limit: yes"]


def test_it_does_not_start_when_the_reservations_leave_nothing_for_jobs(agent_argv):
    import subprocess

    ran = subprocess.run(
        agent_argv("--reserved-cpus", "9999"), capture_output=True, text=True, timeout=60
    )
    assert ran.returncode == 2
    assert "cannot start: --reserved-cpus 9999 leaves no core for jobs" in ran.stderr


def test_check_prints_the_cores_and_memory_for_jobs_and_fails_reservations_that_leave_none():
    import io

    from agents.check import main as check

    out = io.StringIO()
    argv = [
        "--simulate",
        "2xH100-80GB,cpus=64,mem=512G@pcie",
        "--no-containers",
        "--confine",
        "off",
    ]
    check([*argv, "--reserved-cpus", "2", "--reserved-memory", "4G"], out)
    report = out.getvalue()
    assert (
        "[ok]   host: 62 core(s) and 520192 MiB for jobs (reserved 2 core(s), 4096 MiB)" in report
    )
    assert "NUMA node 0: cores 2-31" in report and "NUMA node 1: cores 32-63" in report
    assert "limits: " in report
    out = io.StringIO()
    status = check([*argv, "--reserved-cpus", "64"], out)
    assert "[fail] host: --reserved-cpus 64 leaves no core for jobs (the node has 64)" in (
        out.getvalue()
    )
    assert status & 256
