"""manage.py replay_site: the site's own history replayed under every preset (read-only)."""

import json

from django.core.management.base import BaseCommand, CommandError
from django.utils import timezone

from portal.cli.output import table
from portal.errors import ValidationFailed
from portal.services.reporting.site_history import trace_csv
from portal.services.reporting.site_replay import site_replay
from scheduler.site_replay import LOADS, dominating

COLUMNS = (
    ("policy", "POLICY", "{}"),
    ("mean_wait_s", "MEAN WAIT s", "{:.0f}"),
    ("p50_wait_s", "P50 s", "{:.0f}"),
    ("p99_wait_s", "P99 s", "{:.0f}"),
    ("max_wait_s", "MAX s", "{:.0f}"),
    ("mean_bsld", "BSLD", "{:.2f}"),
    ("utilization", "UTIL", "{:.3f}"),
    ("widest_mean_wait_s", "WIDEST 10% MEAN s", "{:.0f}"),
    ("bound", "BOUND", "{}"),
)


def _loads(text: str) -> tuple[float, ...]:
    try:
        return tuple(float(part) for part in text.split(",") if part.strip())
    except ValueError:
        message = f"--loads: {text!r} is not a list of numbers (e.g. 0.75,1,1.25)"
        raise CommandError(message) from None


class Command(BaseCommand):
    help = (
        "Replay the site's ended bookings of the last --days under every preset, at the site's "
        "GPUs and at other loads, and print how each would have done (reads only)."
    )

    def add_arguments(self, parser):
        parser.add_argument("--days", type=int, default=30, help="the period (default 30)")
        parser.add_argument(
            "--loads",
            default=",".join(f"{load:g}" for load in LOADS),
            help="arrival-rate factors to replay at (default 0.75,1,1.25)",
        )
        parser.add_argument("--presets", default="", help="only these (comma-separated)")
        parser.add_argument("--export", metavar="FILE", help="also write the trace as CSV")
        parser.add_argument("--json", action="store_true", help="one JSON object per row")

    def handle(self, *args, days, loads, presets, export, json: bool, **options):
        names = tuple(name.strip() for name in presets.split(",") if name.strip())

        def progress(done, total, policy, load, seconds):
            self.stderr.write(f"[{done}/{total}] {policy} at load {load:g}: {seconds:.1f} s")

        try:
            result = site_replay(
                days=days, now=timezone.now(), loads=_loads(loads), presets=names, progress=progress
            )
        except ValidationFailed as exc:
            field, reason = next(iter(exc.fields.items()), ("", exc.message))
            raise CommandError(f"--{field}: {reason}" if field else reason) from None
        if export:
            with open(export, "w", newline="") as handle:
                handle.write(trace_csv(result.trace))
        if json:
            for row in result.rows:
                self.stdout.write(_json_line(row))
            return
        trace = result.trace
        self.stdout.write(
            f"{len(trace.rows)} bookings submitted {trace.since:%Y-%m-%d %H:%M} to "
            f"{trace.until:%Y-%m-%d %H:%M} UTC, replayed on {result.gpus} GPUs "
            f"({result.gpus_per_node} per node)"
        )
        for load in dict.fromkeys(row["load"] for row in result.rows):
            here = [row for row in result.rows if row["load"] == load]
            self.stdout.write(
                f"\nload {load:g} ({here[0]['jobs']} jobs, {here[0]['skipped']} skipped)"
            )
            self.stdout.write(_table(here))
            if any(row["policy"] == "current" for row in here):
                better = dominating(result.rows, "current", load)
                said = ", ".join(better) if better else "none"
                self.stdout.write(f"dominating the current policy: {said}")


def _table(rows: list[dict]) -> str:
    return table(
        [title for _, title, _ in COLUMNS],
        [[None if row[k] is None else fmt.format(row[k]) for k, _, fmt in COLUMNS] for row in rows],
    )


def _json_line(row: dict) -> str:
    return json.dumps({k: v for k, v in row.items() if k != "users"}, sort_keys=True)
