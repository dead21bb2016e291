"""Run a booking's command inside its cgroup: join, drop privileges, exec. Standard library only.

The dispatcher starts this file (as root, `python -I jail.py ...`) instead of the command when the
cgroup v1 devices controller confines jobs, or cgroups limit its cores and memory
(agents/limits.py). The process writes its own pid into each of the job's cgroups
before it drops privileges and execs the command, so the command never runs a moment outside its
device list; the pid, session and process group stay the same through the exec. If joining fails,
the command does not run (exit 126, the reason in the job's log).

    python -I agents/jail.py --cgroup DIR [--cgroup DIR...] [--uid U --gid G --groups G1,G2] -- ARGV...
"""

from __future__ import annotations

import argparse
import os
import sys

EXIT_NOT_CONFINED = 126


def main(argv: list[str]) -> int:
    """Join the cgroups, become the job's user, exec the command; return only on failure."""
    p = argparse.ArgumentParser(prog="jail.py")
    p.add_argument("--cgroup", action="append", required=True)
    p.add_argument("--uid", type=int)
    p.add_argument("--gid", type=int)
    p.add_argument("--groups", default="")
    p.add_argument("command", nargs=argparse.REMAINDER)
    args = p.parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        p.error("no command after --")
    try:
        for group in args.cgroup:
            with open(os.path.join(group, "cgroup.procs"), "w") as procs:
                procs.write(str(os.getpid()))
        if args.uid is not None and args.uid != os.geteuid():
            os.setgroups([int(g) for g in args.groups.split(",") if g])
            os.setgid(args.gid)
            os.setuid(args.uid)
    except OSError as exc:
        print(f"gpu-portal: not run: cannot confine the job to its cgroup: {exc}", file=sys.stderr)
        return EXIT_NOT_CONFINED
    try:
        os.execvp(command[0], command)
    except OSError as exc:
        print(f"gpu-portal: cannot run {command[0]}: {exc}", file=sys.stderr)
    return 127


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
