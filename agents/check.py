"""`python -m agents check`: what a site admin runs on a new node before registering it.

It looks, changes nothing on the node that it does not take back (a trivial container per
runtime, from an image it imports and removes), and prints one line per check ([ok], [warn],
[fail] or [skip]) with details under it: the GPUs and MIG layout NVML reports, one reading,
which job confinement works, which limits on a job's cores and memory the node supports
(cpuset, CPU quota, memory limit; by cgroup v1, v2 or systemd), which container runtimes exist and whether each runs a container
(agents/container_trial.py), whether the session host is an address of
this node, whether the portal answers with the node's token, the user map, and whether MPS is
there for shared GPUs (agents/sharing.py). The exit status
is the sum of the failed checks' codes (EXIT_CODES), 0 when none failed.
"""

from __future__ import annotations

import argparse
import ipaddress
import os
import pwd
import shutil
import socket
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TextIO

from agents import confine as confinement
from agents import host
from agents.container_trial import container_trial
from agents.containers import detect_runtimes
from agents.dispatch import DEFAULT_MIN_UID
from agents.limits import CgroupLimits
from agents.portal import AuthError, PortalError, PortalUnavailable
from agents.protocol import CONTAINER_RUNTIMES
from agents.sharing import MPS_CONTROL

# What failed -> its bit in the exit status (2 is bad usage; 1 is also what an unexpected
# error exits with, after a traceback instead of the report).
EXIT_CODES = {
    **{runtime: 1 for runtime in CONTAINER_RUNTIMES},
    "nvml": 4,
    "reading": 8,
    "confinement": 16,
    "session host": 32,
    "portal": 64,
    "user map": 128,
    # Eight bits are all taken: MPS missing where --mps wants it is the GPU stack's failure too.
    "mps": 4,
    "host": 256,
}


@dataclass
class Result:
    """One check: its name, ok / warn / fail / skip, a summary and detail lines."""

    name: str
    status: str
    summary: str
    details: list[str] = field(default_factory=list)


def container_runtimes(which: Callable[[str], str | None] = shutil.which) -> dict[str, str]:
    """The container runtimes on PATH, name -> path: the ones the agent offers at register
    (agents.containers.detect_runtimes, the same probe), with where each was found."""
    return {name: which(name) for name in detect_runtimes(which)}


def check_nvml(backend) -> tuple[Result, list]:
    try:
        gpus = backend.discover()
    except Exception as exc:  # no driver, no library, NVML errors: what a new node shows
        return Result("nvml", "fail", f"cannot read the GPUs: {exc}"), []
    if not gpus:
        return Result("nvml", "fail", "NVML reports no GPU"), []
    details = []
    for gpu in gpus:
        mig = f", MIG on: {len(gpu.mig_instances)} instance(s)" if gpu.mig_mode else ""
        details.append(f"GPU {gpu.index}  {gpu.model}  {gpu.memory_total_mib} MiB  {gpu.uuid}{mig}")
        for instance in gpu.mig_instances:
            details.append(
                f"    {instance.profile} ({instance.slices} slices, "
                f"{instance.memory_total_mib} MiB)  {instance.uuid}"
            )
        details.append(f"    topology: {_topology_line(gpu)}")
    slices = sum(len(g.mig_instances) for g in gpus)
    summary = f"{len(gpus)} GPU(s)" + (f", {slices} MIG instance(s)" if slices else "")
    linked = sum(1 for g in gpus if g.nvlink_peers)
    if linked:
        summary += f", NVLink on {linked}"
    elif any(g.numa_node is not None for g in gpus):
        summary += ", no NVLink"
    return Result("nvml", "ok", summary, details), gpus


def _topology_line(gpu) -> str:
    """What the scheduler will know of the GPU's place: PCI bus, NUMA node, NVLink peers."""
    if gpu.pci_bus_id is None and gpu.numa_node is None and not gpu.nvlink_peers:
        return "not reported (NVML gave no PCI, NUMA or NVLink information)"
    numa = "unknown" if gpu.numa_node is None else str(gpu.numa_node)
    peers = gpu.nvlink_peers
    links = f"NVLink to GPU {', '.join(map(str, peers))}" if peers else "no NVLink (PCIe only)"
    return f"PCI {gpu.pci_bus_id or 'unknown'}, NUMA node {numa}, {links}"


def check_reading(backend, gpus: list) -> Result:
    if not gpus:
        return Result("reading", "skip", "no GPU to read")
    try:
        readings = backend.sample()
    except Exception as exc:
        return Result("reading", "fail", f"cannot sample the GPUs: {exc}")
    expected = len(gpus) + sum(len(g.mig_instances) for g in gpus)
    details = [_reading_line(r) for r in readings]
    if len(readings) != expected:
        summary = f"{len(readings)} reading(s) for {expected} device(s)"
        return Result("reading", "fail", summary, details)
    return Result("reading", "ok", f"{len(readings)} device(s) read", details)


def _reading_line(reading) -> str:
    def value(number, unit: str) -> str:
        return "n/a" if number is None else f"{number:g}{unit}"

    return (
        f"{reading.uuid}: util {value(reading.utilization_gpu, ' %')}, memory "
        f"{value(reading.memory_used_mib, '')}/{value(reading.memory_total_mib, ' MiB')}, "
        f"{value(reading.temperature_c, ' C')}, {value(reading.power_w, ' W')}, "
        f"{len(reading.processes)} process(es)"
    )


def check_confinement(mode: str, hostname: str) -> Result:
    works = {}
    for each in ("systemd", "cgroup"):
        try:
            works[each] = confinement.choose(each, agent=hostname).how
        except confinement.ConfinementError as exc:
            works[each] = f"no: {exc}"
    details = [f"{name}: {how}" for name, how in works.items()]
    try:
        chosen = confinement.choose(mode, agent=hostname)
    except confinement.ConfinementError as exc:
        return Result("confinement", "fail", str(exc), details)
    if isinstance(chosen, confinement.NoConfinement):
        status = "ok" if mode == "off" else "warn"
        summary = f"--confine {mode}: jobs unconfined (CUDA_VISIBLE_DEVICES only): {chosen.reason}"
        return Result("confinement", status, summary, details)
    return Result("confinement", "ok", f"--confine {mode}: {chosen.how}", details)


def check_host(backend, reserved_cpus: int = 0, reserved_memory_mib: int = 0) -> Result:
    """The cores and memory the agent would report, after the site's reservations."""
    try:
        found = getattr(backend, "host", lambda: None)() or host.read_machine()
    except (OSError, host.HostError) as exc:
        return Result("host", "fail", f"cannot read the cores and memory: {exc}")
    try:
        usable = host.reserve(found, cpus=reserved_cpus, memory_mib=reserved_memory_mib)
    except host.HostError as exc:  # the agent would not start
        return Result("host", "fail", str(exc))
    summary = (
        f"{len(usable.cpus)} core(s) and {usable.memory_mib} MiB for jobs "
        f"(reserved {reserved_cpus} core(s), {reserved_memory_mib} MiB)"
    )
    details = [f"NUMA node {n.numa_node}: cores {n.cpu_list}" for n in usable.numa_cpus()]
    return Result("host", "ok", summary, details)


def check_limits(mode: str, hostname: str, cgroups: CgroupLimits | None = None) -> Result:
    """Which of a job's limits (cpuset, CPU quota, memory limit) this node enforces, and how."""
    cgroups = cgroups or CgroupLimits(agent=hostname)
    try:
        chosen = confinement.choose(mode, agent=hostname)
    except confinement.ConfinementError:
        chosen = None  # the agent would not start: the confinement check says why
    if isinstance(chosen, confinement.SystemdScope):
        how = f"systemd scope properties ({cgroups.version})"
        have = {"cpuset": cgroups.v2, "cpu": True, "memory": True}  # no AllowedCPUs= on v1
    elif os.geteuid() != 0:
        how, have = "", {}
    else:
        how, have = f"{cgroups.version} under {cgroups.root}", dict(cgroups.supported)
    names = {"cpuset": "cpuset", "cpu": "cpu quota", "memory": "memory limit"}
    details = [f"{name}: {'yes' if have.get(c) else 'no'}" for c, name in names.items()]
    if not any(have.values()):
        why = cgroups.missing() or "no controller"
        return Result("limits", "warn", f"jobs run without core and memory limits: {why}", details)
    ok = [name for c, name in names.items() if have.get(c)]
    status = "ok" if len(ok) == len(names) else "warn"
    return Result("limits", status, f"{', '.join(ok)} by {how}", details)


def check_runtimes(
    which: Callable[[str], str | None] = shutil.which,
    offered: list[str] | None = None,
    extra_args: dict[str, list[str]] | None = None,
    trial: Callable[[str, list[str]], str | None] = container_trial,
) -> list[Result]:
    """The runtimes found, then one trivial container through each the agent would offer
    (`offered`: its --container-runtime list; None: every one installed)."""
    found = container_runtimes(which)
    if offered is not None:
        found = {name: path for name, path in found.items() if name in offered}
    if not found:
        wanted = ", ".join(offered) if offered else ", ".join(CONTAINER_RUNTIMES)
        summary = "none offered (--no-containers)" if offered == [] else f"none found ({wanted})"
        return [Result("container runtimes", "ok", summary)]
    details = [f"{name}: {path}" for name, path in found.items()]
    results = [Result("container runtimes", "ok", ", ".join(found), details)]
    for name in found:
        args = list((extra_args or {}).get(name, ()))
        reason = trial(name, args)
        given = f" (with {' '.join(args)})" if args else ""
        if reason:
            results.append(Result(name, "fail", f"cannot run a container{given}: {reason}"))
        else:
            results.append(Result(name, "ok", f"runs a trivial container{given}"))
    return results


def check_session_host(host: str) -> Result:
    name = "session host"
    try:
        family, *_, address = socket.getaddrinfo(host, 0, type=socket.SOCK_STREAM)[0]
        with socket.socket(family, socket.SOCK_STREAM) as probe:
            probe.bind(address[:2] if family == socket.AF_INET else address)
    except OSError as exc:
        return Result(name, "fail", f"{host}: not an address of this node ({exc})")
    if _loopback(host):
        return Result(
            name,
            "warn",
            f"{host}: loopback; only a portal on this machine reaches sessions there "
            "(set --session-host to this node's address on the portal's network)",
        )
    return Result(name, "ok", f"{host}: sessions listen here; the portal must reach its ports")


def _loopback(host: str) -> bool:
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return host == "localhost"


def check_portal(portal, url: str | None) -> Result:
    if not url:
        return Result("portal", "skip", "no --portal given")
    if portal is None:
        return Result("portal", "fail", f"{url}: no node token (--token, --token-file)")
    try:
        desired = portal.get_desired()
    except AuthError as exc:
        return Result("portal", "fail", f"{url} refused the token: {exc}")
    except PortalUnavailable as exc:
        return Result("portal", "fail", f"{url} does not answer: {exc}")
    except PortalError as exc:
        return Result("portal", "fail", f"{url}: {exc}")
    bookings = len(desired.bookings)
    return Result("portal", "ok", f"{url} answers; token accepted ({bookings} active booking(s))")


def check_user_map(path: str | None, load, min_uid: int) -> Result:
    if not path:
        return Result("user map", "ok", "none: portal usernames run as the Unix user of that name")
    try:
        mapping = load(path)
    except (OSError, ValueError) as exc:
        return Result("user map", "fail", f"{path}: {exc}")
    details, bad = [], 0
    for portal_user, unix_user in sorted(mapping.items()):
        try:
            account = pwd.getpwnam(unix_user)
        except KeyError:
            details.append(f"{portal_user} -> {unix_user}: no such Unix user")
            bad += 1
            continue
        if account.pw_uid < min_uid:
            details.append(
                f"{portal_user} -> {unix_user}: uid {account.pw_uid} < --min-uid {min_uid}"
            )
            bad += 1
        else:
            details.append(f"{portal_user} -> {unix_user} (uid {account.pw_uid})")
    summary = f"{path}: {len(mapping)} user(s)" + (f", {bad} cannot run jobs" if bad else "")
    return Result("user map", "fail" if bad else "ok", summary, details)


def check_mps(wanted: bool, which: Callable[[str], str | None] = shutil.which) -> Result:
    """Whether nvidia-cuda-mps-control is there: needed with --mps, a note without it."""
    found = which(MPS_CONTROL)
    if found:
        how = "--mps: one daemon per shared GPU" if wanted else "available (the agent's --mps)"
        return Result("mps", "ok", f"{MPS_CONTROL} at {found}; {how}")
    if wanted:
        return Result("mps", "fail", f"--mps, but no {MPS_CONTROL} on PATH")
    return Result(
        "mps",
        "skip",
        f"no {MPS_CONTROL} on PATH: shared GPUs are held to their memory shares by the "
        "agent's memory watch alone",
    )


def exit_status(results: list[Result]) -> int:
    """The failed checks' codes, each counted once (two runtimes failing are still 1)."""
    codes = {EXIT_CODES[r.name] for r in results if r.status == "fail" and r.name in EXIT_CODES}
    return sum(codes)


def report(results: list[Result], out: TextIO) -> None:
    for result in results:
        out.write(f"[{result.status}]".ljust(7) + f"{result.name}: {result.summary}\n")
        for line in result.details:
            out.write(f"         {line}\n")


def build_parser() -> argparse.ArgumentParser:
    from agents.__main__ import _count, _size  # the agent's own option readers

    p = argparse.ArgumentParser(prog="python -m agents check", description=__doc__.split("\n")[0])
    p.add_argument("--portal", help="portal base URL; checked with the token when given")
    p.add_argument("--token", help="node token (or GPU_PORTAL_TOKEN, or --token-file)")
    p.add_argument("--token-file", help="file holding the node token")
    p.add_argument("--hostname", default=socket.gethostname())
    p.add_argument("--simulate", metavar="SPEC", help="simulated GPUs, e.g. 8xH100-80GB")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--site-id", default="")
    p.add_argument("--user-map", metavar="FILE", help='JSON {"portal_user": "unix_user"}')
    p.add_argument("--min-uid", type=int, default=DEFAULT_MIN_UID)
    p.add_argument("--confine", choices=list(confinement.MODES), default="auto")
    p.add_argument("--session-host", default="127.0.0.1")
    p.add_argument("--reserved-cpus", type=_count, default=0, metavar="N")
    p.add_argument("--reserved-memory", type=_size, default=0, metavar="SIZE")
    p.add_argument("--container-runtime", action="append", choices=CONTAINER_RUNTIMES)
    p.add_argument("--no-containers", action="store_true")
    p.add_argument("--container-arg", action="append", default=[], metavar="RUNTIME=ARG")
    p.add_argument("--mps", action="store_true", help="the agent will run with --mps")
    return p


def main(argv: list[str], out: TextIO = sys.stdout) -> int:
    """Run every check, print the report, return the exit status."""
    # The agent's own option readers.
    from agents.__main__ import _backend, _container_args, _token, _user_map
    from agents.portal import PortalClient

    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        container_args = _container_args(args.container_arg)
    except argparse.ArgumentTypeError as exc:
        parser.error(str(exc))
    out.write(f"GPU Portal agent check on {args.hostname}\n")
    try:
        backend = _backend(args)
    except Exception as exc:  # the NVML library or driver missing, a bad SPEC
        backend = _Broken(exc)
    nvml, gpus = check_nvml(backend)
    results = [nvml, check_reading(backend, gpus)]
    try:
        token = _token(args)
    except OSError as exc:
        results.append(Result("portal", "fail", f"cannot read the token: {exc}"))
        token = None
    results += [
        check_host(backend, args.reserved_cpus, args.reserved_memory),
        check_confinement(args.confine, args.hostname),
        check_limits(args.confine, args.hostname),
        *check_runtimes(
            offered=[] if args.no_containers else args.container_runtime,
            extra_args=container_args,
        ),
        check_session_host(args.session_host),
    ]
    if not any(r.name == "portal" for r in results):
        portal = PortalClient(args.portal, token) if args.portal and token else None
        results.append(check_portal(portal, args.portal))
    results.append(check_user_map(args.user_map, _user_map, args.min_uid))
    results.append(check_mps(args.mps))
    backend.close()
    report(results, out)
    status = exit_status(results)
    failed = [r.name for r in results if r.status == "fail"]
    out.write(
        f"exit {status}" + (f": failed {', '.join(failed)}" if failed else ": all passed") + "\n"
    )
    return status


class _Broken:
    """A backend that could not be made: every call says why."""

    def __init__(self, error: Exception) -> None:
        self._error = error

    def discover(self):
        raise self._error

    def sample(self):
        raise self._error

    def close(self) -> None:
        pass
