"""`gpus`: the devices free now (or all of them), with their latest readings."""

from __future__ import annotations

from .client import OK, Client
from .output import print_json, table


def gpus(client: Client, args) -> int:
    """Devices free now (every device with --all, marked free or not), with latest readings."""
    query = {name: getattr(args, name) for name in ("model", "node") if getattr(args, name)}
    whole = client.get_all("/api/v1/gpus/", query)
    migs = client.get_all("/api/v1/mig-instances/", query)
    free = {
        ("gpu", g["id"]) for g in client.get_all("/api/v1/gpus/", {**query, "free": "true"})
    } | {
        ("mig", m["id"])
        for m in client.get_all("/api/v1/mig-instances/", {**query, "free": "true"})
    }
    for kind, rows in (("gpu", whole), ("mig", migs)):
        for row in rows:
            row["free"] = (kind, row["id"]) in free
    index = {g["uuid"]: g["index"] for g in whole}  # a MIG instance names its GPU by UUID
    if not args.all:
        whole = [g for g in whole if g["free"]]
        migs = [m for m in migs if m["free"]]
    if args.json:
        print_json({"gpus": whole, "mig_instances": migs})
        return OK
    if not whole and not migs:
        print("No device is free now." if not args.all else "No devices.")
        return OK
    rows = [[_gpu_label(g), g["model"], _mib(g["memory_mib"]), g] for g in whole]
    rows += [
        [m.get("label") or f"{m['node']}/gpu{index.get(m['gpu'], '?')}/{m['profile']}",
         m["model"], _mib(m["memory_mib"]), m]
        for m in migs
    ]  # fmt: skip
    headers = ["DEVICE", "MODEL", "MEMORY", "UTIL", "MEM USED", "TEMP", "POWER", "PROCS"]
    if args.all:
        headers.insert(1, "FREE")
    print(table(headers, [_device_row(row, args.all) for row in rows]))
    return OK


def _gpu_label(gpu: dict) -> str:
    return f"{gpu['node']}/gpu{gpu['index']}" + (" (MIG)" if gpu["mig_mode"] else "")


def _device_row(row: list, with_free: bool) -> list:
    label, model, memory, device = row
    free = ["yes" if device["free"] else "no"] if with_free else []
    return [label, *free, model, memory, *_reading(device)]


def _mib(value) -> str | None:
    return None if value is None else f"{value / 1024:.0f} GiB"


def _reading(device: dict) -> list:
    r = device.get("reading") or {}
    util = r.get("utilization_gpu")
    used, total = r.get("memory_used_mib"), r.get("memory_total_mib")
    temp, power = r.get("temperature_c"), r.get("power_w")
    return [
        None if util is None else f"{util:.0f}%",
        None if used is None else f"{used / 1024:.1f}/{(total or 0) / 1024:.0f} GiB",
        None if temp is None else f"{temp:.0f}C",
        None if power is None else f"{power:.0f}W",
        r.get("processes") if r else None,
    ]
