"""`gpu-portal`: arguments, the client, and one exit code per outcome (docs/cli.md)."""

from __future__ import annotations

import argparse
import os
import sys

from . import __version__, account, commands, config, devices, maintenance, output, sessions
from .client import NOT_AUTHENTICATED, USAGE, Client, CliError

EPILOG = """\
exit codes: 0 ok, 1 refused or failed, 2 usage, 3 not authenticated, 4 not found,
5 conflict (quota, no capacity, state), 6 portal busy or unreachable, 7 --wait timed out,
8 --wait: the booking ended without success (never started, or failed, cancelled, ...),
141 output closed (e.g. piped into head).
The portal and token come from --url, GPU_PORTAL_URL, GPU_PORTAL_TOKEN, or the file
`gpu-portal login` writes ($XDG_CONFIG_HOME/gpu-portal/config.json)."""


def _whole(text: str) -> int:
    """A whole number of digits 0-9 (argparse's int also takes other scripts' digits, '١٢')."""
    if not (text.isascii() and text.isdigit() and len(text) <= 18):
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number (digits 0-9)")
    return int(text)


def _fraction(text: str) -> float:
    """A share of a GPU, 0 < F < 1, in ASCII digits ('0.25', '.5')."""
    try:
        return output.parse_fraction(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from exc


def _memory(text: str) -> int:
    """A memory size in MiB from '20G', '20GiB', '512M', '20480' (MiB)."""
    try:
        return output.parse_memory_mib(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from exc


def _globals(defaults: bool) -> argparse.ArgumentParser:
    """--json, --utc and --url, accepted before or after the command."""
    value = None if defaults else argparse.SUPPRESS
    flag = False if defaults else argparse.SUPPRESS
    parser = argparse.ArgumentParser(add_help=False)
    parser.add_argument("--json", action="store_true", default=flag, help="print the API's JSON")
    parser.add_argument("--utc", action="store_true", default=flag, help="times in UTC")
    parser.add_argument("--url", default=value, help="the portal (default: GPU_PORTAL_URL/config)")
    return parser


def _booking_options(parser: argparse.ArgumentParser) -> None:
    what = parser.add_mutually_exclusive_group()
    what.add_argument("-g", "--gpus", type=_whole, help="whole GPUs (default 1)")
    what.add_argument(
        "--mig", metavar="PROFILE", help="one MIG slice of this profile, e.g. 3g.40gb"
    )
    what.add_argument(
        "--fraction",
        type=_fraction,
        metavar="F",
        help="a fraction 0 < F < 1 of one shared GPU's compute, e.g. 0.25",
    )
    parser.add_argument(
        "--gpu-memory",
        type=_memory,
        metavar="SIZE",
        help="the GPU memory it needs on one shared GPU: 20G, 512M, 20GiB (alone or with "
        "--fraction)",
    )
    parser.add_argument(
        "--cpus", type=_whole, metavar="N", help="CPU cores per node (default: the site's)"
    )
    parser.add_argument(
        "--mem",
        type=_memory,
        metavar="SIZE",
        help="host memory per node: 64G, 512M, 1T, 65536 (MiB) (default: the site's)",
    )
    model = parser.add_mutually_exclusive_group()
    model.add_argument("-m", "--model", help="GPU model, e.g. A100-80GB")
    model.add_argument(
        "--any-model",
        action="store_true",
        help="GPUs of different models will do (else 2 or more GPUs are of one model)",
    )
    parser.add_argument("-p", "--project", help="project (needed if you are in several)")
    parser.add_argument("-t", "--time", metavar="DURATION", help="90m, 2h, 1d, HH:MM:SS")
    parser.add_argument("--start", help="reservation start: 2030-01-01T09:00, now+1h")
    parser.add_argument("--end", help="reservation end (with --start)")
    parser.add_argument("-q", "--qos", help="quality of service, e.g. normal, high, low")
    parser.add_argument("--preemptible", action="store_true", help="may be preempted")
    parser.add_argument(
        "-N", "--nodes", type=_whole, metavar="N", help="on N whole nodes, one process each"
    )
    parser.add_argument("--workdir", metavar="DIR", help="the job's working directory (absolute)")
    parser.add_argument(
        "--env",
        action="append",
        metavar="NAME=VALUE",
        type=_env_pair,
        help="an environment variable for the command (repeatable)",
    )
    parser.add_argument(
        "--signal", metavar="SIG[@S]", help="a signal S seconds before the end, e.g. USR1@120"
    )
    parser.add_argument(
        "--image", help="run the command in this container image, e.g. docker://nvcr.io/..."
    )
    parser.add_argument(
        "--array", metavar="SPEC", help="a job array: 0-99%%10 (100 tasks, at most 10 at once)"
    )
    parser.add_argument(
        "--after",
        action="append",
        metavar="DEP",
        help="start after: afterok:41, afternotok:41, afterany:41:42 (repeatable)",
    )
    parser.add_argument("command", nargs=argparse.REMAINDER, help="batch command (after --)")


def _env_pair(text: str) -> tuple[str, str]:
    name, equals, value = text.partition("=")
    if not equals or not name:
        raise argparse.ArgumentTypeError(f"{text!r}: write NAME=VALUE")
    return name, value


def _refresh_seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not 0.5 <= value <= 3600:
        raise argparse.ArgumentTypeError(f"{text!r}: a number of seconds from 0.5 to 3600")
    return value


def build_parser() -> argparse.ArgumentParser:
    common = _globals(defaults=False)
    parser = argparse.ArgumentParser(
        prog="gpu-portal",
        description="Book whole GPUs and MIG slices on the GPU Portal.",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
        parents=[_globals(defaults=True)],
    )
    parser.add_argument("--version", action="version", version=f"gpu-portal {__version__}")
    sub = parser.add_subparsers(dest="name", metavar="COMMAND", required=True)

    def add(name: str, help: str, run) -> argparse.ArgumentParser:
        command = sub.add_parser(name, help=help, description=help, parents=[common])
        command.set_defaults(run=run)
        return command

    p = add("login", "store a token for the portal (asks for the password)", account.login)
    p.add_argument("-u", "--username")
    p.add_argument("--password-stdin", action="store_true", help="read the password from stdin")
    p.add_argument("--token-name", help="a name for the token (default: cli on <host>)")

    p = add("submit", "submit a booking", commands.submit)
    _booking_options(p)
    p.add_argument("--wait", action="store_true", help="follow it until it starts")
    p.add_argument("--wait-timeout", type=float, metavar="S", help="give up waiting after S s")
    p.add_argument("--interval", type=float, default=5.0, help="poll every S s (default 5)")
    p.add_argument("--idempotency-key", help="retrying with the same key submits once")
    session = p.add_mutually_exclusive_group()
    session.add_argument(
        "--jupyter", action="store_true", help="a JupyterLab session (open it with `open ID`)"
    )
    session.add_argument("--terminal", action="store_true", help="a terminal session")

    p = add("estimate", "when would it start if submitted now? (writes nothing)", commands.estimate)
    _booking_options(p)

    p = add("queue", "the queue: running, then waiting, with position and reason", commands.queue)
    p.add_argument("-p", "--project")
    p.add_argument("-o", "--owner", help="only this user's bookings")
    p.add_argument(
        "-w", "--watch", action="store_true", help="show it again every --interval s (Ctrl-C stops)"
    )
    p.add_argument(
        "--interval",
        type=_refresh_seconds,
        default=5.0,
        metavar="S",
        help="with --watch: every S s (default 5)",
    )

    p = add("list", "bookings you can see, newest first", commands.list_)
    p.add_argument("-s", "--state", action="append", help="only this state (repeatable)")
    p.add_argument("-p", "--project")
    p.add_argument("-o", "--owner")
    p.add_argument("-n", "--limit", type=_whole, default=20, help="at most N (default 20)")

    for name, help, run in (
        ("show", "one booking in full", commands.show),
        ("release", "end an active booking now and free its devices", commands.release),
    ):
        add(name, help, run).add_argument("id", type=_whole)

    p = add("cancel", "cancel a queued, planned or active booking", commands.cancel)
    p.add_argument("id", type=int)
    p.add_argument(
        "--array",
        action="store_true",
        help="cancel every task of the job array ID (its first task) names, in one call",
    )

    p = add("extend", "extend a booking", commands.extend)
    p.add_argument("id", type=_whole)
    p.add_argument("by", metavar="DURATION", help="by how long: 30m, 2h, HH:MM:SS")

    add("quota", "your limits and usage per project", account.quota)

    p = add("gpus", "devices free now, with live readings", devices.gpus)
    p.add_argument("-a", "--all", action="store_true", help="every device, free or not")
    p.add_argument("-m", "--model")
    p.add_argument("-n", "--node")

    p = add(
        "open", "wait for an interactive booking's session, then open it", sessions.open_session
    )
    p.add_argument("id", type=_whole)
    p.add_argument(
        "--print", dest="print_only", action="store_true", help="print the URL, open no browser"
    )
    p.add_argument("--wait-timeout", type=float, default=300.0, metavar="S", help="default 300")
    p.add_argument("--interval", type=float, default=3.0, help="poll every S s (default 3)")

    p = add("logs", "a batch booking's output", commands.logs)
    p.add_argument("id", type=_whole)
    p.add_argument("-f", "--follow", action="store_true", help="keep printing until it ends")
    p.add_argument("--interval", type=float, default=5.0, help="poll every S s (default 5)")

    help = "maintenance windows of the site's nodes"
    p = sub.add_parser("maintenance", help=help, description=help, parents=[common])
    actions = p.add_subparsers(dest="maintenance_action", metavar="ACTION", required=True)
    p = actions.add_parser(
        "list",
        help="windows planned or under way, soonest first",
        description="Maintenance windows planned or under way, soonest first.",
        parents=[common],
    )
    p.set_defaults(run=maintenance.maintenance_list)
    p.add_argument("-a", "--all", action="store_true", help="over ones too")
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    output.USE_UTC = args.utc
    try:
        return _run(parser, args)
    except CliError as error:
        print(f"gpu-portal: {_describe(error)}", file=sys.stderr)
        return error.exit_code
    except ValueError as error:  # a bad duration or time, a broken config file
        print(f"gpu-portal: {error}", file=sys.stderr)
        return USAGE
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        # The reader went away (`gpu-portal queue | head`): stop quietly, as cat or ls do. Python
        # would report the pipe again when it flushes stdout at exit, so point it at /dev/null.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 141


def _run(parser: argparse.ArgumentParser, args) -> int:
    if args.run is account.login:
        return account.login(args)
    settings = config.settings(args.url)
    if not settings.token:
        raise CliError(
            "Not logged in: run `gpu-portal login` or set GPU_PORTAL_TOKEN.",
            exit_code=NOT_AUTHENTICATED,
        )
    client = Client(settings.url, settings.token)
    try:
        return args.run(client, args)
    except CliError as error:
        if args.json and error.body is not None:
            output.print_json(error.body)
        raise


def _describe(error: CliError) -> str:
    """The API's message, its code in brackets, and any field it does not already name."""
    text = error.message + (f" [{error.code}]" if error.code else "")
    shown = {k: v for k, v in error.fields.items() if f"{k}:" not in error.message}
    for field, reason in shown.items():
        text += f"\n  {field}: {reason}"
    return text
