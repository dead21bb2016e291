"""`python -m agents --portal URL --token TOKEN ...`: run the node agent until SIGTERM."""

from __future__ import annotations

import argparse
import json
import logging
import os
import signal
import socket
import sys

from agents import protocol
from agents.agent import Agent
from agents.dispatch import DEFAULT_MIN_UID
from agents.portal import AuthError
from agents.protocol import CONTAINER_RUNTIMES

EXIT_BAD_TOKEN = 3
EXIT_BAD_USAGE = 2


def _host_name(text: str) -> str:
    # The portal refuses any other name at register: say so at start, in one line.
    if not protocol.is_hostname(text):
        raise argparse.ArgumentTypeError(f"{text!r} {protocol.HOSTNAME_RULE}")
    return text


def _node_address(text: str) -> str:
    if not protocol.is_node_address(text):
        raise argparse.ArgumentTypeError(f"{text!r} {protocol.ADDRESS_RULE}")
    return text


def build_parser() -> argparse.ArgumentParser:
    """The command line, as docs/agent.md documents it."""
    p = argparse.ArgumentParser(prog="python -m agents", description=__doc__)
    p.add_argument("--portal", required=True, help="portal base URL, e.g. https://gpus.example.org")
    p.add_argument("--token", help="node token (or GPU_PORTAL_TOKEN, or --token-file)")
    p.add_argument("--token-file", help="file holding the node token (keeps it out of ps)")
    p.add_argument("--hostname", type=_host_name, default=socket.gethostname())
    p.add_argument("--interval", type=float, help="seconds between readings (portal decides)")
    p.add_argument("--sync-interval", type=float, help="seconds between desired-state pulls")
    p.add_argument("--simulate", metavar="SPEC", help="simulated GPUs, e.g. 8xH100-80GB")
    p.add_argument("--seed", type=int, default=0, help="seed of the simulated readings")
    p.add_argument(
        "--site-id", default="", help="simulated UUIDs unique to one portal install (up sets it)"
    )
    p.add_argument("--user-map", metavar="FILE", help='JSON {"portal_user": "unix_user"}')
    p.add_argument("--state-dir", default="/var/lib/gpu-portal-agent")
    p.add_argument("--policy", choices=["report", "warn", "kill"], help="override the portal's")
    p.add_argument("--grace", type=float, default=30.0, help="seconds from SIGTERM to SIGKILL")
    p.add_argument(
        "--stop-jobs-on-exit",
        type=_seconds,
        metavar="S",
        help="on SIGTERM/SIGINT also stop the jobs and sessions this agent launched (SIGKILL "
        "after S seconds) instead of leaving them for the next agent to re-adopt",
    )
    p.add_argument(
        "--min-uid",
        type=int,
        default=DEFAULT_MIN_UID,
        help="refuse to run jobs as users below this uid (root, system accounts)",
    )
    p.add_argument(
        "--confine",
        choices=["auto", "systemd", "cgroup", "off"],
        default="auto",
        help="how jobs are held to their devices' /dev nodes (see docs/agent.md)",
    )
    p.add_argument(
        "--session-host",
        default="127.0.0.1",
        help="address interactive sessions listen on; the portal must reach it (docs/interactive.md)",
    )
    p.add_argument(
        "--session-python",
        help="the Python with JupyterLab that runs interactive sessions (default: the agent's)",
    )
    p.add_argument(
        "--session-dir", help="the directory sessions open in (default: the owner's home)"
    )
    p.add_argument(
        "--address",
        type=_node_address,
        help="this node's address on the site network, where the other nodes of a multi-node "
        "job reach rank 0 (MASTER_ADDR; default: the hostname, docs/distributed.md)",
    )
    p.add_argument(
        "--default-workdir",
        metavar="DIR",
        help="where jobs that ask for no working directory run (default: the owner's home)",
    )
    p.add_argument(
        "--container-runtime",
        action="append",
        choices=CONTAINER_RUNTIMES,
        help="a container runtime to offer (repeatable; default: those installed)",
    )
    p.add_argument("--no-containers", action="store_true", help="offer no container runtime at all")
    p.add_argument(
        "--container-arg",
        action="append",
        default=[],
        metavar="RUNTIME=ARG",
        help="an extra option for a runtime's launch line, e.g. podman=--runtime=/usr/sbin/runc",
    )
    p.add_argument(
        "--no-container-devices",
        action="store_true",
        help="give containers no devices (no --device, no --nv): simulated GPUs, which no CDI "
        "spec names; CUDA_VISIBLE_DEVICES still lists the booked UUIDs",
    )
    p.add_argument(
        "--mps",
        action="store_true",
        help="run an MPS control daemon per shared GPU and hold each tenant to its share of "
        "the SMs and memory through it (needs nvidia-cuda-mps-control; docs/agent.md)",
    )
    p.add_argument(
        "--gpu-memory-grace",
        type=_seconds,
        default=30.0,
        metavar="S",
        help="stop a job on a shared GPU that stays above its memory share this long "
        "(default 30 s)",
    )
    p.add_argument(
        "--reserved-cpus",
        type=_count,
        default=0,
        metavar="N",
        help="cores kept for the system (the lowest-numbered); jobs get the others",
    )
    p.add_argument(
        "--reserved-memory",
        type=_size,
        default=0,
        metavar="SIZE",
        help="host memory kept for the system, e.g. 4G; jobs get the rest",
    )
    p.add_argument("--no-push", action="store_true", help="pull only; no websocket")
    p.add_argument("--log-level", default="INFO")
    return p


def _container_args(pairs: list[str]) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for pair in pairs:
        runtime, sep, arg = pair.partition("=")
        if not sep or runtime not in CONTAINER_RUNTIMES:
            raise argparse.ArgumentTypeError(f"--container-arg {pair!r}: write RUNTIME=ARG")
        out.setdefault(runtime, []).append(arg)
    return out


def _count(text: str) -> int:
    if not text.isascii() or not text.isdigit() or len(text) > 5:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of cores >= 0")
    return int(text)


def _size(text: str) -> int:
    from agents.host import HostError, parse_size_mib

    try:
        return parse_size_mib(text, "--reserved-memory", low=0)
    except HostError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not 0 <= value < float("inf"):
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds >= 0")
    return value


def _token(args: argparse.Namespace) -> str | None:
    if args.token_file:
        with open(args.token_file) as f:
            return f.read().strip()
    return args.token or os.environ.get("GPU_PORTAL_TOKEN")


def _backend(args: argparse.Namespace):
    if args.simulate:
        from agents.simulate import SimulatedBackend

        return SimulatedBackend(args.simulate, args.hostname, seed=args.seed, site=args.site_id)
    from agents.nvml import NvmlBackend

    return NvmlBackend()


def _user_map(path: str | None) -> dict[str, str]:
    if not path:
        return {}
    with open(path) as f:
        mapping = json.load(f)
    if not isinstance(mapping, dict) or not all(isinstance(v, str) for v in mapping.values()):
        raise ValueError(f"{path}: expected a JSON object of portal user -> Unix user")
    return mapping


def main(argv: list[str] | None = None) -> int:
    """Parse the command line, run the agent, return the exit status."""
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["check"]:  # `python -m agents check`: a new node's checks (agents/check.py)
        from agents.check import main as check

        return check(argv[1:])
    args = build_parser().parse_args(argv)
    logging.basicConfig(
        level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(message)s"
    )
    token = _token(args)
    if not token:
        logging.error("no node token: pass --token, --token-file or GPU_PORTAL_TOKEN")
        return EXIT_BAD_USAGE
    try:
        agent = Agent(
            args.portal,
            token,
            _backend(args),
            hostname=args.hostname,
            state_dir=args.state_dir,
            user_map=_user_map(args.user_map),
            policy=args.policy,
            report_interval_s=args.interval,
            sync_interval_s=args.sync_interval,
            grace_s=args.grace,
            stop_jobs_on_exit_s=args.stop_jobs_on_exit,
            push=not args.no_push,
            min_uid=args.min_uid,
            confine=args.confine,
            session_host=args.session_host,
            session_python=args.session_python,
            session_dir=args.session_dir,
            address=args.address,
            default_workdir=args.default_workdir,
            container_runtimes=[] if args.no_containers else args.container_runtime,
            container_args=_container_args(args.container_arg),
            container_devices=not args.no_container_devices,
            mps=args.mps,
            memory_grace_s=args.gpu_memory_grace,
            reserved_cpus=args.reserved_cpus,
            reserved_memory_mib=args.reserved_memory,
        )
    except Exception as exc:  # no driver, bad SPEC, bad user map: say so and stop
        logging.error("cannot start: %s", exc)
        return EXIT_BAD_USAGE
    signal.signal(signal.SIGTERM, lambda *_: agent.stop())
    signal.signal(signal.SIGINT, lambda *_: agent.stop())
    try:
        agent.run()
    except AuthError as exc:
        logging.error("%s; check the token of node %s, exiting", exc, args.hostname)
        return EXIT_BAD_TOKEN
    return 0


if __name__ == "__main__":
    sys.exit(main())
