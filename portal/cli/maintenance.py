"""`maintenance list`: the maintenance windows, planned, under way and over."""

from __future__ import annotations

from .client import OK, Client
from .output import print_json, table, when

STATES = ("planned", "under_way", "over")


def maintenance_list(client: Client, args) -> int:
    """Windows soonest first; over ones only with --all."""
    windows = client.get_all("/api/v1/maintenance/", {})
    if not args.all:
        windows = [w for w in windows if w["state"] != "over"]
    if args.json:
        print_json(windows)
        return OK
    if not windows:
        print("No maintenance window planned or under way." if not args.all else "No windows.")
        return OK
    rows = [
        [w["id"], w["state"].replace("_", " "), when(w["start"]), when(w["end"]), _nodes(w),
         w["reason"]]
        for w in windows
    ]  # fmt: skip
    print(table(["ID", "STATE", "START", "END", "NODES", "REASON"], rows))
    return OK


def _nodes(window: dict) -> str:
    if window["all_nodes"]:
        return "all nodes"
    names = ", ".join(window["nodes"])
    if window["network_group"]:
        return f"group {window['network_group']}" + (f" ({names})" if names else "")
    return names
