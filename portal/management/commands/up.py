"""`manage.py up`: set up and run the whole portal in one command.

Embedded default (no DATABASE_URL/REDIS_URL): SQLite, in-process channel layer, and the periodic
jobs (the allocation pass and the rest of CELERY_BEAT_SCHEDULE) run in a thread of this process.
With REDIS_URL: a Celery worker and beat run as child processes instead. Either way it migrates,
seeds the demo and starts one simulated agent per demo node (server mode: only with --demo), and
serves the ASGI app (`manage.py serve`: uvicorn, WEB_WORKERS processes in server mode).
SIGTERM or SIGINT (Ctrl-C) stops all of it, the agents' jobs and sessions included, and `up`
exits with 0. A child that dies is started again after a backoff; one that keeps dying makes `up`
exit with 1 (see Children).
"""

import contextlib
import getpass
import json
import logging
import logging.config
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable

from django.conf import settings
from django.core.management import call_command
from django.core.management.base import BaseCommand, CommandError
from django.db import DatabaseError, OperationalError, close_old_connections, connection

from portal.management.commands.serve import serve, web_workers
from portal.services.fleet.nodes import node_token_issue
from portal.services.reporting.demo import (
    DEMO_NODES,
    DEMO_PASSWORD,
    DEMO_USERS,
    demo_nodes_up,
    demo_queue_seed,
    demo_site_id,
)

log = logging.getLogger(__name__)


class Command(BaseCommand):
    help = "Migrate, seed the demo, start simulated agents and the scheduler, and serve the portal."

    def add_arguments(self, parser):
        parser.add_argument(
            "--host", default="127.0.0.1", help="Address to listen on (0.0.0.0: every interface)."
        )
        parser.add_argument("--port", type=int, default=8000, help="Port to listen on.")
        parser.add_argument(
            "--demo",
            action="store_true",
            help="Seed the demo users and simulated nodes (the default only in embedded mode).",
        )
        parser.add_argument("--no-demo", action="store_true", help="Skip the demo data and agents.")

    def handle(self, *args, host, port, demo, no_demo, **options):
        # A real database never gets the published demo password unless the operator asks.
        no_demo = no_demo or not (demo or settings.EMBEDDED)
        _quiet_console()
        database_ensure()
        call_command("migrate", interactive=False, verbosity=0)
        call_command("collectstatic", interactive=False, verbosity=0)
        url = f"http://{host}:{port}"
        notify_defaults(url, demo=not no_demo)
        children = Children()
        _stop_on_signals(children)
        if not no_demo:
            demo_agent_args()  # a bad DEMO_AGENT_ARGS stops up now, in one line
            call_command("seed_demo")
        if settings.REDIS_URL:
            children.add(_start_celery)
        else:
            threading.Thread(target=_embedded_beat, name="embedded-beat", daemon=True).start()

        def listening() -> None:
            # Agents started earlier would only log "connection refused" until the port opens,
            # and the banner is the last thing on the console: what to open, and the logins.
            if not no_demo:
                children.add(lambda: _start_agents(url))
                if not settings.REDIS_URL:  # the embedded demo (server mode: see _demo_queue)
                    threading.Thread(target=_demo_queue, name="demo-queue", daemon=True).start()
            self._banner(url, no_demo)

        _when_listening(host, port, listening)
        threading.Thread(target=_supervise, args=(children,), name="supervise", daemon=True).start()
        serve(host=host, port=port, workers=web_workers())
        _exit_now(children)

    def _banner(self, url: str, no_demo: bool) -> None:
        mode = (
            "PostgreSQL + Redis + Celery" if settings.REDIS_URL else "embedded (SQLite, in-process)"
        )
        lines = [
            f"GPU Portal running at {url}/  ({mode}, {web_workers()} web worker(s))",
            f"  API docs: {url}/api/docs/  admin: {url}/admin/",
        ]
        if not no_demo:
            users = ", ".join(name for name, _, _ in DEMO_USERS)
            lines.append(f"  demo logins: {users}  password: {DEMO_PASSWORD}")
        self.stdout.write(self.style.SUCCESS("\n".join(lines)))


_LOG_LEVEL_GIVEN = False


def _quiet_console() -> None:
    """Keep `up`'s console to warnings unless LOG_LEVEL asks for more.

    Request logs (uvicorn's access log is off; Django's "Not Found" lines are request-level) and
    the periodic jobs' "task succeeded" lines would bury the banner and any real warning.
    The levels go into LOGGING as well as onto the loggers: Celery's Django fixup configures
    logging from LOGGING again when it loads the tasks, which resets levels set only in code.
    """
    global _LOG_LEVEL_GIVEN
    _LOG_LEVEL_GIVEN = "LOG_LEVEL" in os.environ
    quiet = {}
    if not _LOG_LEVEL_GIVEN:
        # In the environment too, for the children (agents, Celery, web workers).
        os.environ["LOG_LEVEL"] = "WARNING"
        settings.LOGGING["root"]["level"] = "WARNING"
        # Celery sets its task-trace logger to INFO itself: one line per finished periodic job.
        quiet |= {"django.request": "ERROR", "celery.app.trace": "WARNING"}
    if not settings.REDIS_URL:
        # The embedded in-memory broker has no host name; kombu warns about that on every task.
        quiet["kombu.connection"] = "ERROR"
    loggers = settings.LOGGING.setdefault("loggers", {})
    for name, level in quiet.items():
        loggers[name] = {"level": level}
    logging.config.dictConfig(settings.LOGGING)


def _when_listening(host: str, port: int, then) -> None:
    """Call `then()` in a thread once something accepts connections on (host, port)."""
    address = {"0.0.0.0": "127.0.0.1", "": "127.0.0.1", "::": "::1"}.get(host, host)
    threading.Thread(target=_wait_then, args=(address, port, then), daemon=True).start()


def _wait_then(address: str, port: int, then, poll_s: float = 0.1) -> None:
    while True:
        try:
            socket.create_connection((address, port), timeout=1).close()
        except OSError:
            time.sleep(poll_s)
        else:
            then()
            return


def database_ensure() -> None:
    """Connect to the database, creating it on its PostgreSQL server if it does not exist yet.

    Anything else that stops the connection is one line that says what to fix (CommandError),
    not a traceback.
    """
    try:
        _connect_once()
        return
    except (OperationalError, DatabaseError) as exc:
        reason = str(exc).strip().partition("\n")[0] or type(exc).__name__
        if connection.vendor != "postgresql" or "does not exist" not in str(exc):
            raise CommandError(f"Cannot reach the database ({_where()}): {reason}") from None
    _create_postgresql_database()


def _connect_once() -> None:
    """Open one connection outside the pool, whose timeout would hide PostgreSQL's own reason."""
    if connection.vendor != "postgresql":
        connection.ensure_connection()
        return
    import psycopg

    db = settings.DATABASES["default"]
    params = {k: db[K] for k, K in _CONNECT_KEYS.items() if db.get(K)}
    try:
        psycopg.connect(dbname=db["NAME"], connect_timeout=10, **params).close()
    except psycopg.Error as exc:
        raise DatabaseError(str(exc)) from exc


def _where() -> str:
    db = settings.DATABASES["default"]
    return f"{db.get('NAME')} on {db.get('HOST') or 'localhost'}:{db.get('PORT') or 5432}"


def _create_postgresql_database() -> None:
    import psycopg
    from psycopg import sql

    db = settings.DATABASES["default"]
    params = {k: db[K] for k, K in _CONNECT_KEYS.items() if db.get(K)}
    try:
        with psycopg.connect(dbname="postgres", autocommit=True, **params) as admin:
            admin.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(db["NAME"])))
    except psycopg.Error as exc:
        raise CommandError(
            f"Database {_where()} does not exist and could not be created ({exc}); "
            f"create it with: createdb {db['NAME']}"
        ) from None
    connection.close()
    log.warning("created database %s", _where())


_CONNECT_KEYS = {"host": "HOST", "port": "PORT", "user": "USER", "password": "PASSWORD"}


def _start_agents(url: str) -> list[subprocess.Popen]:
    """One simulated node agent per demo node, each with a fresh token.

    Demo users have no Unix accounts here, so their batch commands run as whoever runs `up`.
    """
    children = []
    user_map = settings.VAR_DIR / "agents" / "demo-user-map.json"
    user_map.parent.mkdir(parents=True, exist_ok=True)
    user_map.write_text(json.dumps({name: getpass.getuser() for name, _, _ in DEMO_USERS}))
    site_id = demo_site_id()  # the ids seed_demo built these nodes' devices with
    for hostname, spec in DEMO_NODES.items():
        token = node_token_issue(hostname=hostname)
        state_dir = settings.VAR_DIR / "agents" / hostname
        state_dir.mkdir(parents=True, exist_ok=True)
        # Demo JupyterLab sessions keep their notebooks here, not in the home of whoever runs up.
        (state_dir / "notebooks").mkdir(exist_ok=True)
        (state_dir / "work").mkdir(exist_ok=True)
        env = {**os.environ, "GPU_PORTAL_TOKEN": token}
        command = [
            sys.executable,
            "-m",
            "agents",
            "--portal",
            url,
            "--hostname",
            hostname,
            "--simulate",
            spec,
            "--state-dir",
            str(state_dir),
            "--user-map",
            str(user_map),
            "--site-id",
            site_id,
            "--min-uid",  # demo jobs run as whoever runs up (see the user map above)
            str(os.geteuid()),
            "--session-dir",
            str(state_dir / "notebooks"),
            # Batch jobs (and their gpu-portal-<id>.out) too; every demo node is this machine,
            # so rank 0 of a multi-node job listens on loopback (docs/distributed.md).
            "--default-workdir",
            str(state_dir / "work"),
            "--address",
            "127.0.0.1",
            # Stopping up stops the demo's jobs and sessions too, not only their agents.
            "--stop-jobs-on-exit",
            str(_AGENT_JOBS_GRACE_S),
            "--log-level",
            _agent_log_level(),
            # Simulated GPUs: no CDI spec or driver knows them, so a container gets none.
            "--no-container-devices",
            *demo_agent_args(),
        ]
        children.append(_child(command, env=env))
    return children


# What `up` gives its agents itself: DEMO_AGENT_ARGS may not say otherwise.
_AGENT_ARGS_OF_UP = {
    "--portal", "--hostname", "--simulate", "--state-dir", "--user-map", "--site-id",
    "--token", "--token-file",
}  # fmt: skip
_DEMO_AGENT_ARGS_MAX = 4096


def demo_agent_args() -> list[str]:
    """DEMO_AGENT_ARGS as the agents' extra words, checked with the agent's own parser; a bad
    value is a CommandError naming the setting."""
    import shlex

    from agents.__main__ import build_parser

    text = settings.DEMO_AGENT_ARGS
    if len(text) > _DEMO_AGENT_ARGS_MAX:
        raise CommandError(f"DEMO_AGENT_ARGS: at most {_DEMO_AGENT_ARGS_MAX} characters")
    try:
        words = shlex.split(text)
    except ValueError as exc:
        raise CommandError(f"DEMO_AGENT_ARGS: {exc}") from None
    taken = sorted({word.split("=", 1)[0] for word in words} & _AGENT_ARGS_OF_UP)
    if taken:
        raise CommandError(f"DEMO_AGENT_ARGS: up sets {', '.join(taken)} itself")
    parser = build_parser()

    def refuse(message: str):
        raise CommandError(f"DEMO_AGENT_ARGS: {message}")

    parser.error = refuse
    parser.parse_args(["--portal", "http://127.0.0.1", *words])
    return words


def _agent_log_level() -> str:
    """The simulated agents' level: errors only, unless LOG_LEVEL was given to `up`. Their
    warnings are about the demo machine, not a site (jobs unconfined when `up` is not root,
    events left unsent when `up` stops the portal before them)."""
    return os.environ["LOG_LEVEL"] if _LOG_LEVEL_GIVEN else "ERROR"


def _demo_queue(timeout_s: float = 120.0, poll_s: float = 0.5) -> None:
    """Once the demo's agents have registered, give the demo its queue (running, waiting, a
    reservation; portal.services.reporting.demo), unless the queue of an earlier start waits.

    Embedded mode only for now: in server mode the Celery worker reported delivery_send tasks
    for deliveries it could not find right after the queue was made, not yet understood."""
    deadline = time.monotonic() + timeout_s
    try:
        while not demo_nodes_up():
            if time.monotonic() > deadline:
                log.warning(
                    "demo nodes not up after %d s: the demo starts without a queue", timeout_s
                )
                return
            time.sleep(poll_s)
        demo_queue_seed()
    except Exception:  # the demo's queue is a nicety; the portal serves without it
        log.exception("could not seed the demo's queue")
    finally:
        close_old_connections()


def _start_celery() -> list[subprocess.Popen]:
    # --quiet: no startup banners of their own after (or in the middle of) up's banner.
    base = [sys.executable, "-m", "celery", "-A", "portal", "--quiet"]
    workers = _worker_env()
    return [
        # The allocation pass has a queue of its own (CELERY_TASK_ROUTES) and a worker of its
        # own: a flood of notification work never stands in front of a pass.
        _child(
            base
            + ["worker", "--loglevel", "WARNING", "--concurrency", "1"]
            + ["--queues", settings.CELERY_PASS_QUEUE, "--hostname", "pass@%h"],
            env=workers,
        ),
        _child(
            base
            + ["worker", "--loglevel", "WARNING", "--concurrency", "2"]
            + ["--queues", settings.CELERY_TASK_DEFAULT_QUEUE, "--hostname", "work@%h"],
            env=workers,
        ),
        _child(
            base + ["beat", "--loglevel", "WARNING", "--schedule", str(settings.VAR_DIR / "beat")]
        ),
    ]


# Celery's own warning to a worker run as root: eight lines per worker, said once by up instead.
_CELERY_ROOT_WARNING = "You're running the worker with superuser privileges"


def _worker_env() -> dict | None:
    """The Celery workers' environment: when up runs as root (so do they), one line of up's
    says so, and Python's warning filter keeps Celery's eight-line SecurityWarning out."""
    if os.geteuid() != 0:
        return None
    log.warning(
        "the Celery workers run as root, as up does: in production run up as another user, "
        "or the workers with celery worker --uid"
    )
    given = os.environ.get("PYTHONWARNINGS")
    ignore = f"ignore:{_CELERY_ROOT_WARNING}"
    return {**os.environ, "PYTHONWARNINGS": f"{given},{ignore}" if given else ignore}


def _child(command: list[str], env: dict | None = None) -> subprocess.Popen:
    """A child in a process group of its own: a Ctrl-C reaches `up` only, which stops the children
    in order (agents their jobs first), and a stuck child is killed with all it started."""
    process = subprocess.Popen(command, env=env, cwd=settings.BASE_DIR, start_new_session=True)
    process.start_env = env  # what Children.supervise_once starts it again with
    return process


def _embedded_beat() -> None:
    """Run every CELERY_BEAT_SCHEDULE entry in-process at its interval (embedded mode's beat)."""
    from celery import current_app

    current_app.loader.import_default_modules()
    due = {name: 0.0 for name in settings.CELERY_BEAT_SCHEDULE}
    while True:
        now = time.monotonic()
        for name, entry in settings.CELERY_BEAT_SCHEDULE.items():
            if now >= due[name]:
                due[name] = now + float(entry["schedule"])
                _run_task(current_app, entry["task"])
        time.sleep(0.5)


def _run_task(app, task_name: str) -> None:
    close_old_connections()
    try:
        app.tasks[task_name].apply()
    except Exception:  # a failing job must not stop the loop; it is logged and retried next time
        log.exception("periodic task %s failed", task_name)
    finally:
        close_old_connections()


class Children:
    """The processes `up` started, supervised: one that dies is started again after a backoff
    (1 s, doubling to 30 s); one that dies _CRASH_LIMIT times within _CRASH_WINDOW_S makes `up`
    give up and exit non-zero, so the service manager restarts the whole. Once stopping, a
    start still under way (the agents start when the port opens) finishes and is stopped with
    the rest; none begins after."""

    def __init__(self) -> None:
        # Reentrant: the signal handler runs in the main thread, which may be inside add().
        self._lock = threading.RLock()
        self._processes: list[subprocess.Popen] = []
        self._stopping = False
        self._deaths: dict[tuple, list[float]] = {}
        self._due: dict[int, float] = {}  # index of a dead child -> when to start it again

    def add(self, start: Callable[[], list[subprocess.Popen]]) -> None:
        with self._lock:
            if not self._stopping:
                self._processes += start()

    def stop(self) -> None:
        with self._lock:
            self._stopping = True
        _stop(self._processes)

    @property
    def processes(self) -> list[subprocess.Popen]:
        """The children now (a restarted one replaces the one that died)."""
        with self._lock:
            return list(self._processes)

    def supervise_once(self, now: float) -> bool:
        """Start again the children that died and whose backoff is over. Returns False when
        one keeps dying (up should exit non-zero), True otherwise."""
        with self._lock:
            if self._stopping:
                return True
            for index, process in enumerate(self._processes):
                if process.poll() is None:
                    continue
                if index not in self._due:
                    if not self._died(process, now):
                        return False
                    self._due[index] = now + self._backoff(process)
                elif now >= self._due[index]:
                    del self._due[index]
                    self._processes[index] = _child(list(process.args), env=process.start_env)
        return True

    def _died(self, process: subprocess.Popen, now: float) -> bool:
        key = tuple(process.args)
        deaths = [t for t in self._deaths.get(key, []) if t > now - _CRASH_WINDOW_S] + [now]
        self._deaths[key] = deaths
        log.warning(
            "%s (pid %d) exited with %s; starting it again (%d in %d s)",
            _name(process),
            process.pid,
            process.returncode,
            len(deaths),
            _CRASH_WINDOW_S,
        )
        return len(deaths) < _CRASH_LIMIT

    def _backoff(self, process: subprocess.Popen) -> float:
        return min(2.0 ** (len(self._deaths[tuple(process.args)]) - 1), 30.0)


# A child that dies this often within the window is not coming back by itself.
_CRASH_LIMIT = 5
_CRASH_WINDOW_S = 300
_SUPERVISE_EVERY_S = 0.5


def _name(process: subprocess.Popen) -> str:
    """e.g. "celery worker pass@%h", "agents gpu-node-1": what the log calls a child."""
    args = list(process.args)
    words = [args[2] if len(args) > 2 else str(args[0])]
    words += [word for word in ("worker", "beat") if word in args]
    for flag in ("--hostname",):
        if flag in args[:-1]:
            words.append(args[args.index(flag) + 1])
    return " ".join(words)


def _supervise(children: Children) -> None:
    """Watch the children until up stops; exit 1 (stopping the rest) when one keeps dying."""
    while children.supervise_once(time.monotonic()):
        time.sleep(_SUPERVISE_EVERY_S)
    log.error("a child of up keeps dying; up exits so that its service manager restarts it")
    _exit_now(children, code=1)


def _exit_now(children: Children, code: int = 0) -> None:
    """Leave once the server has stopped (SIGTERM/SIGINT), without joining request threads.

    On shutdown the ASGI server stops its event loop while a request thread may still be inside
    a view, waiting in asgiref's async_to_sync for that loop; a normal interpreter exit would join
    it forever. Its transaction never committed, so there is nothing to finish.
    """
    children.stop()
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def _stop_on_signals(children: Children) -> None:
    """SIGTERM and SIGINT stop the children, then `up` leaves with 0: no traceback.

    While it serves, uvicorn takes both signals for its own graceful stop and raises them again
    once it has stopped, which lands here; before and after serving they land here directly.
    """

    def stop(signum, frame) -> None:
        for each in (signal.SIGTERM, signal.SIGINT):  # a second Ctrl-C must not cut the stop short
            signal.signal(each, signal.SIG_IGN)
        _exit_now(children)

    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, stop)


# Agents give their jobs this long after SIGTERM; up gives agents, worker and beat _STOP_S.
_AGENT_JOBS_GRACE_S = 5
_STOP_S = 15


def _stop(children: list[subprocess.Popen]) -> None:
    """SIGTERM each child; after _STOP_S, SIGKILL to the process group of any still running."""
    for child in children:
        child.terminate()
    deadline = time.monotonic() + _STOP_S
    for child in children:
        try:
            child.wait(timeout=max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            log.warning(
                "%s (pid %d) ignored SIGTERM for %d s; killing it",
                _name(child),
                child.pid,
                _STOP_S,
            )
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(child.pid, signal.SIGKILL)
            child.wait()


def notify_defaults(url: str, *, demo: bool) -> None:
    """Links in messages point at this server unless SITE_URL says otherwise, mail is kept in
    EMAIL_FILE_PATH unless EMAIL_BACKEND says otherwise; the demo turns idle reclaim on (short
    windows, so it shows) and quota borrowing. Set here and in the environment, so the Celery
    processes started next agree."""
    import socket

    host = url.split("//", 1)[1].rsplit(":", 1)[0]
    if host in ("0.0.0.0", "[::]", "::"):  # listening everywhere: name this machine instead
        url = url.replace(host, socket.getfqdn(), 1)
    # Mail goes to a folder (listed at /staff/mail/), not whole MIME messages on the console.
    defaults = {"SITE_URL": url, "EMAIL_BACKEND": "portal.mailbox.FolderEmailBackend"}
    if demo:
        defaults |= {"IDLE_RECLAIM_ENABLED": "1", "IDLE_MINUTES": "10", "IDLE_GRACE_MINUTES": "5"}
        defaults |= {"QUOTA_BORROWING": "1"}  # carol's over-quota booking starts borrowed
    for name, value in defaults.items():
        if not os.environ.get(name):
            os.environ[name] = value
            setattr(settings, name, int(value) if value.isdigit() else value)
