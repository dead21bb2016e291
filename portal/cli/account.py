"""Account commands: log in (store a token), and see one's quota."""

from __future__ import annotations

import getpass
import socket
import sys

from . import config
from .client import OK, USAGE, Client, CliError
from .output import duration, print_json, table


def login(args) -> int:
    """Exchange a username and password for a token, stored in the config file (0600)."""
    url = config.settings(args.url).url
    if not url:
        raise CliError(
            "Which portal? Pass --url https://gpus.example.org (or set GPU_PORTAL_URL).",
            exit_code=USAGE,
        )
    username = args.username or input(f"Username [{getpass.getuser()}]: ").strip()
    username = username or getpass.getuser()
    if args.password_stdin:
        password = sys.stdin.readline().rstrip("\n")
    else:
        password = getpass.getpass(f"Password for {username} at {url}: ")
    name = args.token_name or f"gpu-portal cli on {socket.gethostname()}"
    answer = Client(url, retries=0).post(
        "/api/v1/auth/token/", {"username": username, "password": password, "name": name}
    )
    path = config.write_file({"url": url, "token": answer["token"], "username": username})
    if args.json:
        print_json({"url": url, "username": username, "config": str(path), "id": answer["id"]})
    else:
        print(f"Logged in to {url} as {username}; token stored in {path}")
    return OK


def quota(client: Client, args) -> int:
    rows = client.get("/api/v1/me/quota/")["results"]
    if args.json:
        print_json(rows)
        return OK
    out = []
    for row in rows:
        limits, mine, theirs = row["limits"], row["usage"], row["project_usage"]
        out.append(
            [
                row["project"],
                row["role"],
                f"{mine['gpus_in_use']:g}/{_limit(limits['max_gpus'])}",
                f"{mine['gpu_hours_used']:.1f}/{_limit(limits['gpu_hours_budget'])}"
                + (f" per {limits['budget_period_days']}d" if limits["gpu_hours_budget"] else ""),
                f"{theirs['gpus_in_use']:g} GPUs, {theirs['gpu_hours_used']:.1f} h",
                duration(limits["max_duration_s"]),
                ",".join(limits["allowed_qos"]) or "all",
                ",".join(limits["allowed_models"]) or "all",
            ]
        )
    headers = ["PROJECT", "ROLE", "GPUS", "GPU-HOURS", "PROJECT USE", "MAX TIME", "QOS", "MODELS"]
    print(table(headers, out))
    return OK


def _limit(value) -> str:
    return "unlimited" if value is None else f"{value:g}"
