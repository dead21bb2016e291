"""The booking commands, one function each: (client, args) -> exit code. Human output unless
args.json. (login and quota are in account.py, gpus in devices.py.)"""

from __future__ import annotations

import shlex
import sys
import time
from datetime import datetime, timedelta

from .client import ENDED, OK, UNAVAILABLE, WAIT_TIMEOUT, Client, CliError
from .output import duration, parse_duration, parse_moment, print_json, table, what, when

BOOKINGS = "/api/v1/bookings/"
QUEUE_STATES = ("pending", "planned", "active")
QUEUE_COLUMNS = ["ID", "USER", "PROJECT", "STATE", "WHAT", "POS", "START", "END", "REASON"]
LIST_COLUMNS = ["ID", "STATE", "WHAT", "PROJECT", "USER", "SUBMITTED", "START", "END", "DEVICES"]
ENDED_STATES = {"finished", "cancelled", "preempted", "failed", "expired"}


def _booking_body(args) -> dict:
    body: dict = {}
    if args.gpus is not None:
        body["gpus"] = args.gpus
    if args.mig:
        body["mig_profile"] = args.mig
    fraction = getattr(args, "fraction", None)
    memory = getattr(args, "gpu_memory", None)
    if fraction is not None:
        body["gpu_fraction"] = fraction
    if memory is not None:
        body["gpu_memory_mib"] = memory
    if getattr(args, "cpus", None) is not None:
        body["cpus"] = args.cpus
    if getattr(args, "mem", None) is not None:
        body["memory_mib"] = args.mem
    if args.model:
        body["gpu_model"] = args.model
    if args.any_model:
        body["mixed_models"] = True
    if args.project:
        body["project"] = args.project
    if args.start:
        body["start"] = parse_moment(args.start)
    if args.end:
        body["end"] = parse_moment(args.end)
    if args.time and args.start and not args.end:  # a window given as start and length
        length = timedelta(seconds=parse_duration(args.time))
        body["end"] = (datetime.fromisoformat(body["start"]) + length).isoformat()
    elif args.time:
        body["duration_s"] = parse_duration(args.time)
    if args.qos:
        body["qos"] = args.qos
    if args.preemptible:
        body["preemptible"] = True
    if args.image:
        body["image"] = args.image
    if args.array:
        body["array"] = args.array
    if args.after:
        body["after"] = ",".join(args.after)
    command = _command(args.command)
    if command:
        body["command"] = command
    if args.nodes is not None:
        body["node_count"] = args.nodes
    if args.workdir:
        body["workdir"] = args.workdir
    if args.env:
        body["env"] = dict(args.env)
    if args.signal:
        body["signal"] = args.signal
    interactive = _interactive(args)
    if interactive:
        if command:
            raise ValueError("--jupyter and --terminal run no command: give one or the other")
        body["interactive"] = interactive
    shared = fraction is not None or memory is not None
    if args.gpus is None and not args.mig and args.nodes is None and not shared:
        body["gpus"] = 1
    return body


def _interactive(args) -> str:
    """The API's `interactive` from --jupyter / --terminal (estimate has neither)."""
    if getattr(args, "jupyter", False):
        return "jupyterlab"
    if getattr(args, "terminal", False):
        return "terminal"
    return ""


def _command(words: list[str]) -> str:
    """One word is the command as written (`"python train.py"`); several are shell-quoted."""
    words = words[1:] if words[:1] == ["--"] else words
    return words[0] if len(words) == 1 else shlex.join(words)


def submit(client: Client, args) -> int:
    headers = {"Idempotency-Key": args.idempotency_key} if args.idempotency_key else None
    booking = client.post(BOOKINGS, _booking_body(args), headers=headers)
    if not args.wait:
        _show_or_json(booking, args, summary=f"Submitted booking {booking['id']}")
        if booking.get("interactive") not in (None, "", "none") and not args.json:
            print(f"Open it once it runs: gpu-portal open {booking['id']}", file=sys.stderr)
        return OK
    print(f"Submitted booking {booking['id']}; waiting for it to start", file=sys.stderr)
    return _wait(client, booking, args)


def _wait(client: Client, booking: dict, args) -> int:
    """Poll until the booking is active or ran and finished (0), ended without success (8) or
    the wait ran out (7). A requeued booking (pending again) is waited for anew."""
    deadline = time.monotonic() + args.wait_timeout if args.wait_timeout else None
    said = ""
    while True:
        outcome = _wait_outcome(booking)
        if outcome is not None:
            code, summary = outcome
            _show_or_json(booking, args, summary=f"Booking {booking['id']} {summary}")
            return code
        line = _progress(booking)
        if line != said:
            print(line, file=sys.stderr)
            said = line
        if deadline is not None and time.monotonic() >= deadline:
            if args.json:
                print_json(booking)
            raise CliError(
                f"Booking {booking['id']} has not started after {args.wait_timeout:g} s; "
                f"it stays queued (`gpu-portal cancel {booking['id']}` to withdraw it).",
                exit_code=WAIT_TIMEOUT,
            )
        time.sleep(args.interval)
        booking = client.get(f"{BOOKINGS}{booking['id']}/")


def _wait_outcome(booking: dict) -> tuple[int, str] | None:
    """(exit code, what happened) once the wait is over; None: it still waits (pending or
    planned, a requeued one included). Finished is reached only from active: it ran, and a
    command exited 0 on every node, however short the run was (between two polls)."""
    state = booking["state"]
    if state == "active":
        return OK, "is active"
    if state == "finished":
        return OK, "ran and finished"
    if state not in ENDED_STATES:
        return None
    if booking.get("started_at"):
        return ENDED, f"ran and ended {state}"
    return ENDED, "ended without starting"


def _progress(booking: dict) -> str:
    parts = [f"booking {booking['id']}: {_state(booking)}"]
    if booking.get("restart_count"):  # back in the queue after a run ended early (requeued)
        parts.append(f"restart {booking['restart_count']}")
    if booking.get("queue_position"):
        parts.append(f"position {booking['queue_position']}")
    if booking.get("planned_start"):
        parts.append(f"planned start {when(booking['planned_start'])}")
    if booking.get("pending_reason"):
        parts.append(f"reason {booking['pending_reason']}")
    return ", ".join(parts)


def estimate(client: Client, args) -> int:
    answer = client.post(f"{BOOKINGS}estimate/", _booking_body(args))
    if args.json:
        print_json(answer)
        return OK
    # The answer's names: booking's field names (planned_start, pending_reason, state_detail),
    # or the older earliest_start, reason, detail.
    start = answer.get("planned_start", answer.get("earliest_start"))
    reason = answer.get("pending_reason", answer.get("reason"))
    detail = answer.get("state_detail", answer.get("detail"))
    window = answer.get("next_window")
    rows = [
        ("Earliest start", when(start) or "not possible now"),
        ("Reason", reason),
        ("Queue position", answer.get("queue_position")),
        ("Detail", detail),
        # A window that does not fit: the next one of the same length that does.
        ("Next window", f"{when(window['start'])} to {when(window['end'])}" if window else None),
    ]
    _pairs(rows)
    return OK


def queue(client: Client, args) -> int:
    """Live bookings as far as the user may see them: running, then queued in order. --watch
    shows it again every --interval seconds, as `watch squeue` does, until Ctrl-C (exit 0)."""
    if args.watch and args.json:
        raise ValueError("--watch shows the table again and again; --json prints it once")
    if not args.watch:
        rows = _queue_rows(client, args)
        if args.json:
            print_json(rows)
        else:
            print(_booking_table(rows, QUEUE_COLUMNS))
        return OK
    try:
        while True:
            _queue_refresh(client, args)
            time.sleep(args.interval)
    except KeyboardInterrupt:
        return OK


def _queue_rows(client: Client, args) -> list[dict]:
    query = {"state": list(QUEUE_STATES), **_filters(args, "project", "owner")}
    rows = client.get_all(BOOKINGS, query)
    order = {"active": 0, "pending": 1, "planned": 2}
    rows.sort(
        key=lambda b: (
            order.get(b["state"], 3),
            b.get("queue_position") or 10**9,
            b.get("planned_start") or b.get("start") or "",
            b["id"],
        )
    )
    return rows


def _queue_refresh(client: Client, args) -> None:
    """One screen of --watch: a terminal is cleared first; a pipe gets the screens in a row.
    A portal that is busy or away is said on stderr and asked again at the next refresh."""
    try:
        text = _booking_table(_queue_rows(client, args), QUEUE_COLUMNS)
    except CliError as error:
        if error.exit_code != UNAVAILABLE:
            raise
        text = f"(portal unavailable: {error.message})"
    clear = "\033[H\033[2J" if sys.stdout.isatty() else ""
    stamp = datetime.now().astimezone().strftime("%Y-%m-%d %H:%M:%S")
    sys.stdout.write(f"{clear}Every {args.interval:g} s: gpu-portal queue    {stamp}\n\n")
    sys.stdout.write(text + "\n")
    sys.stdout.flush()


def _filters(args, *names: str) -> dict:
    """The list filters (query parameters) the user gave."""
    return {name: getattr(args, name) for name in names if getattr(args, name)}


def _end(booking: dict) -> str | None:
    """When it ends (or ended): an allocation's end, else the window's."""
    ends = [d["end"] for d in booking.get("devices") or [] if d.get("end")]
    return booking.get("ended_at") or (max(ends) if ends else booking.get("end"))


def list_(client: Client, args) -> int:
    rows = client.get_all(BOOKINGS, _filters(args, "state", "project", "owner"), limit=args.limit)
    if args.json:
        print_json(rows)
        return OK
    print(_booking_table(rows, LIST_COLUMNS))
    return OK


# Booking table columns: header -> the cell of one booking.
_COLUMNS = {
    "ID": lambda b: b["id"],
    "USER": lambda b: b["owner"],
    "PROJECT": lambda b: b["project"],
    "STATE": lambda b: _state(b),
    "WHAT": what,
    "POS": lambda b: b.get("queue_position"),
    "SUBMITTED": lambda b: when(b.get("submitted_at")),
    "START": lambda b: when(b.get("started_at") or b.get("planned_start") or b.get("start")),
    "END": lambda b: when(_end(b)),
    "REASON": lambda b: b.get("pending_reason"),
    "DEVICES": lambda b: ",".join(d["device"] for d in b.get("devices") or []),
}


def _state(booking: dict) -> str:
    """The state, and "(borrowed)" for a run past its quota's limit (preemptible)."""
    return booking["state"] + (" (borrowed)" if booking.get("borrowed") else "")


def _borrowed(booking: dict):
    if not booking.get("borrowed"):
        return None
    return f"yes, past the {booking.get('borrowed_past') or 'quota'} limit (preemptible)"


def _booking_table(bookings: list[dict], headers: list[str]) -> str:
    return table(headers, [[_COLUMNS[h](b) for h in headers] for b in bookings])


def show(client: Client, args) -> int:
    booking = client.get(f"{BOOKINGS}{args.id}/")
    _show_or_json(booking, args)
    return OK


def _show_or_json(booking: dict, args, *, summary: str = "") -> None:
    if args.json:
        print_json(booking)
        return
    if summary:
        print(summary)
    started = booking.get("started_at")
    _pairs(
        [
            ("Booking", booking["id"]),
            ("State", booking["state"]),
            ("Borrowed", _borrowed(booking)),
            ("Detail", booking.get("state_detail")),
            ("Owner", f"{booking['owner']} ({booking['project']})"),
            ("What", what(booking)),
            ("Cores and memory", _host(booking)),
            ("QOS", booking.get("qos")),
            ("Duration", duration(booking.get("duration_s"))),
            ("Submitted", when(booking.get("submitted_at"))),
            ("Queue position", booking.get("queue_position")),
            ("Planned start", when(booking.get("planned_start")) if not started else None),
            ("Pending reason", booking.get("pending_reason")),
            ("Started", when(booking.get("started_at"))),
            ("Ends", when(_end(booking))),
            ("Command", booking.get("command")),
            ("Working directory", booking.get("workdir")),
            ("Output file", booking.get("output_file")),
            ("Environment", " ".join(f"{k}={v}" for k, v in (booking.get("env") or {}).items())),
            ("Signal", booking.get("signal")),
            ("Restarts", booking.get("restart_count") or None),
            ("Image", booking.get("image")),
            ("Array", _array(booking.get("array"))),
            ("After", _after(booking.get("dependencies"))),
            ("Exit code", booking.get("exit_code")),
            ("CUDA_VISIBLE_DEVICES", booking.get("cuda_visible_devices")),
        ]
    )
    for node, devices in _by_node(booking.get("devices") or []):
        print()
        print(f"{node}: {_devices_of(devices)}")
        rows = [[d["device"], d["uuid"], when(d["start"]), when(d["end"])] for d in devices]
        print(table(["DEVICE", "UUID", "FROM", "TO"], rows))
    runs = booking.get("nodes") or []
    if len(runs) > 1:  # a multi-node job: each node's process (its output: --json)
        print()
        rows = [[r["rank"], r["node"], r["state"], r["exit_code"]] for r in runs]
        print(table(["RANK", "NODE", "STATE", "EXIT"], rows))


def _host(booking: dict) -> str:
    """'16 cores, 64 GiB per node; holds gpu-a01: 16 cores, 64 GiB' (what it asked, else the
    site's default, then what it holds on each node)."""
    asked = []
    if booking.get("cpus") is not None:
        asked.append(f"{booking['cpus']} cores")
    if booking.get("memory_mib") is not None:
        asked.append(_gib(booking["memory_mib"]))
    text = ", ".join(asked) + " per node" if asked else "the site's default"
    held = booking.get("held") or []
    if held:
        text += "; holds " + "; ".join(
            f"{h['node']}: {h['cpus']} cores, {_gib(h['memory_mib'])}" for h in held
        )
    return text


def _gib(mib: int) -> str:
    """'64 GiB', '85.3 GiB' or '512 MiB'."""
    if mib < 1024:
        return f"{mib} MiB"
    return f"{mib // 1024} GiB" if mib % 1024 == 0 else f"{mib / 1024:.1f} GiB"


def _by_node(devices: list) -> list:
    """(node, its devices) in the order the nodes first appear: each node's devices apart."""
    nodes: dict = {}
    for device in devices:
        nodes.setdefault(device.get("node") or "?", []).append(device)
    return list(nodes.items())


def _devices_of(devices: list) -> str:
    """'2 devices, A100-80GB' or '8 devices, 4 A100-80GB + 4 H100-80GB'."""
    counts: dict = {}
    for device in devices:
        model = device.get("model") or "unknown model"
        counts[model] = counts.get(model, 0) + 1
    models = " + ".join(
        name if len(counts) == 1 else f"{n} {name}" for name, n in sorted(counts.items())
    )
    plural = "" if len(devices) == 1 else "s"
    return f"{len(devices)} device{plural}, {models}"


def _array(array: dict | None) -> str | None:
    if not array:
        return None
    return f"task {array['task_id']} of array {array['job_id']} ({array['spec']})"


def _after(dependencies: list[dict] | None) -> str | None:
    return ", ".join(f"{d['kind']}:{d['booking']}" for d in dependencies or []) or None


def _pairs(rows) -> None:
    """'Label:  value' lines, skipping empty values."""
    shown = [(label, value) for label, value in rows if value not in (None, "")]
    width = max(len(label) for label, _ in shown) + 1
    for label, value in shown:
        print(f"{label + ':':<{width}}  {value}")


def cancel(client: Client, args) -> int:
    if getattr(args, "array", False):
        return _cancel_array(client, args)
    return _command_on(client, args, "cancel", None, "Cancelled")


def _cancel_array(client: Client, args) -> int:
    """Every task of the array ID names that has not ended, in one call."""
    done = client.post(f"{BOOKINGS}{args.id}/cancel-array/", None)
    if args.json:
        print_json(done)
        return OK
    states = ", ".join(f"{n} {state}" for state, n in sorted(done["states"].items()))
    print(f"Cancelled {len(done['cancelled'])} tasks of array {done['array']} ({states})")
    return OK


def release(client: Client, args) -> int:
    return _command_on(client, args, "release", None, "Released")


def extend(client: Client, args) -> int:
    body = {"by_s": parse_duration(args.by)}
    return _command_on(client, args, "extend", body, f"Extended by {duration(body['by_s'])}:")


def _command_on(client: Client, args, action: str, body, verb: str) -> int:
    booking = client.post(f"{BOOKINGS}{args.id}/{action}/", body)
    if args.json:
        print_json(booking)
    else:
        end = when(_end(booking)) if booking["state"] in QUEUE_STATES else None
        print(
            f"{verb} booking {booking['id']} ({booking['state']}{f', ends {end}' if end else ''})"
        )
    return OK


def logs(client: Client, args) -> int:
    """A batch booking's output (the tail the agent reported); --follow polls for more."""
    booking = client.get(f"{BOOKINGS}{args.id}/")
    if args.json:
        print_json(
            {"id": booking["id"], "state": booking["state"], "log_tail": booking["log_tail"]}
        )
        return OK
    shown = booking.get("log_tail") or ""
    sys.stdout.write(shown)
    sys.stdout.flush()
    while args.follow and booking["state"] in QUEUE_STATES:
        time.sleep(args.interval)
        booking = client.get(f"{BOOKINGS}{args.id}/")
        text = booking.get("log_tail") or ""
        sys.stdout.write(_new_part(shown, text))
        sys.stdout.flush()
        shown = text
    if not shown and not args.follow:
        print(f"(no output from booking {booking['id']} yet)", file=sys.stderr)
    return OK


def _new_part(before: str, after: str) -> str:
    """What `after` adds to `before`; a tail window that moved is matched on its overlap."""
    if after.startswith(before):
        return after[len(before) :]
    for cut in range(len(before)):
        if after.startswith(before[cut:]):
            return after[len(before) - cut :]
    return after
