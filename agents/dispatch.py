"""Launching, watching and stopping the commands of bookings, and surviving agent restarts.

What was launched is written to a JSON state file after every change, so a restarted
agent re-adopts running work instead of killing or relaunching it. A job found gone at a restart
ended while no agent watched: its launch script's exit file says how (agents.jobenv), and one
that left none ended unwatched, reported so (Event.interrupted), never as a plain exit. Jobs
the agent stops as it stops itself (--stop-jobs-on-exit) are reported as stopped by it, by this
agent if the portal still answers, else by the next one. Work is matched to bookings by
booking and devices: a job whose booking moved to other devices (requeued while the agent was
away) is stopped and launched again on the booking's devices.
"""

from __future__ import annotations

import json
import logging
import os
import pwd
import shutil
import signal
import subprocess
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field, fields
from datetime import datetime
from pathlib import Path

from agents import confine, handles, jobenv, limits, sharing
from agents.containers import ContainerLaunch, container_launch, container_remove
from agents.host import HostError, HostResources, format_cpulist, parse_cpulist
from agents.procfs import is_alive, read_stat
from agents.protocol import (
    LOG_TAIL_BYTES,
    DesiredBooking,
    Event,
    Interruption,
    job_env_reserved,
    oom_reason,
)
from agents.session import DEFAULT_HOST, free_port, session_launch, session_listening

log = logging.getLogger(__name__)

# Jobs never run as root or a system account, whatever the user map says (--min-uid).
DEFAULT_MIN_UID = 1000
_STATE_FILE = "state.json"
_EXEC_WAIT_S = 10.0
AGENT_STOPPED = "the node's agent stopped while it ran"
UNWATCHED = "it ended while no agent watched it and left no exit status"


@dataclass
class Job:
    """A launched booking command; `start_ticks` guards against pid reuse after restarts."""

    booking_id: int
    unix_user: str
    device_uuids: list[str]
    end: str
    pid: int
    pgid: int
    start_ticks: int
    log_path: str
    popen: subprocess.Popen | None = field(default=None, repr=False, compare=False)
    stop_reason: str | None = None
    kill_at: float | None = None
    relaunch: bool = False  # stopped because its booking moved: launch it again once gone
    confinement: str | None = None  # its cgroup or scope (agents.confine.release), if any
    reported_size: int = 0  # the log's size when its tail was last reported (output events)
    session_host: str | None = None  # an interactive session: where it listens
    session_port: int | None = None
    session_ready: bool = False
    output_path: str | None = None  # a batch job's gpu-portal-<id>.out in its working directory
    uid: int | None = None  # its user's uid: the output file must be theirs
    job_dir: str | None = None  # its launch script, hostfile and end file (agents.jobenv)
    warn_signal: str | None = None  # sent warn_before_s before the end, and at an early stop
    warn_before_s: int = 0
    warned: bool = False
    kill_wait_s: float | None = None  # SIGTERM to SIGKILL; None: the agent's grace
    term_at: float | None = field(default=None, repr=False)  # an early stop warned: SIGTERM then
    container: list[str] | None = None  # in a container: the runtime and the container's name
    restart: int = 0  # the booking's restart count it was launched for (a requeue launches anew)
    agent_stopped: bool = False  # stopped by the agent as it stopped itself (stop_all)
    shared_gpu: str | None = None  # the shared GPU whose MPS daemon it is a tenant of
    cpu_list: str | None = None  # its cpuset (agents.limits): no other job is given these cores
    memory_mib: int | None = None  # its memory limit, for the reason when the limit kills it

    def persisted(self) -> dict:
        """The fields the state file keeps (not the Popen, not the stop timers)."""
        transient = ("popen", "stop_reason", "kill_at", "relaunch", "reported_size", "term_at")
        return {f.name: getattr(self, f.name) for f in fields(self) if f.name not in transient}

    def exit_code(self) -> tuple[bool, int | None]:
        """(exited?, exit code). An adopted job is no child of this agent: its code is what its
        launch script wrote (agents.jobenv), None when it wrote none."""
        if self.popen is not None:
            code = self.popen.poll()
            return code is not None, code
        if is_alive(self.pid, self.start_ticks):
            return False, None
        return True, jobenv.read_exit_status(_files(self)) if self.job_dir else None


class Dispatcher:
    """Keeps the launched commands in line with the desired bookings."""

    def __init__(
        self,
        state_dir: str | Path,
        user_map: dict[str, str] | None = None,
        grace_s: float = 30.0,
        clock: Callable[[], float] = time.monotonic,
        min_uid: int = DEFAULT_MIN_UID,
        confinement: confine.NoConfinement | confine.SystemdScope | confine.CgroupV1 | None = None,
        device_files: Callable[[list[str]], list[str]] = lambda uuids: [],
        session_host: str = DEFAULT_HOST,
        session_python: str | None = None,
        session_dir: str | None = None,
        hostname: str = "localhost",
        address: str = DEFAULT_HOST,
        default_workdir: str | None = None,
        container_runtimes: list[str] | None = None,
        container_args: dict[str, list[str]] | None = None,
        container_devices: bool = True,
        mps: sharing.MpsDaemons | None = None,
        machine: HostResources | None = None,
        gpu_numa: dict[str, int] | None = None,
    ) -> None:
        self._hostname, self._address = hostname, address
        self._mps = mps  # None: no MPS (--mps not given)
        # The cores jobs' cpusets are picked from, and each device's NUMA node to pick near.
        self._machine = machine
        self._gpu_numa = gpu_numa or {}
        self._default_workdir = default_workdir
        self.container_runtimes = list(container_runtimes or [])
        self._container_args = container_args or {}
        self._container_devices = container_devices
        self._session_host = session_host
        self._session_python = session_python
        self._session_dir = session_dir
        self._state_dir = Path(state_dir)
        self._min_uid = min_uid
        self._confinement = confinement or confine.NoConfinement("switched off")
        self._device_files = device_files
        self._log_dir = self._state_dir / "logs"
        self._log_dir.mkdir(parents=True, exist_ok=True)
        self._user_map = user_map or {}
        self._grace_s = grace_s
        self._clock = clock
        self.jobs: dict[int, Job] = {}
        # Bookings whose command already ran, with the restart count of that run: never launch
        # that run again, even after a restart (a requeued booking's next run is launched).
        self._done: dict[int, int] = {}
        self._dirty = False

    def unix_user(self, owner: str) -> str:
        """The Unix account that runs `owner`'s work: --user-map entry, else the same name."""
        return self._user_map.get(owner, owner)

    def own_pgids(self) -> set[int]:
        """Process groups of the commands this agent launched."""
        return {job.pgid for job in self.jobs.values()}

    def adopt(self, now: datetime) -> list[Event]:
        """Load the state file: re-adopt jobs still running, report those that ended meanwhile."""
        path = self._state_dir / _STATE_FILE
        if not path.exists():
            self._sweep_cgroups()
            return []
        state = json.loads(path.read_text())
        # An older agent's state lists booking ids alone: their first run.
        done = [item if isinstance(item, list) else [item, 0] for item in state.get("done", [])]
        self._done = {int(booking_id): int(restart) for booking_id, restart in done}
        self.jobs = {data["booking_id"]: Job(**data) for data in state.get("jobs", [])}
        for job in self.jobs.values():
            if job.shared_gpu and self._mps is not None:
                # Its daemon outlived the last agent for it (Agent.close): new tenants join it.
                self._mps.tenants.setdefault(job.shared_gpu, set()).add(job.booking_id)
        events = self._reap(now, away=True)  # ended while no agent watched
        log.info("re-adopted %d running job(s) from %s", len(self.jobs), path)
        self._sweep_cgroups()
        return events

    def output(self, now: datetime) -> list[Event]:
        """An `output` event with the log tail of each running job whose log grew since the last."""
        events = []
        for job in self.jobs.values():
            source = _output_source(job)
            try:
                size = os.path.getsize(source)
            except OSError:
                continue
            if size == job.reported_size:
                continue
            tail = log_tail(source)
            if tail is None:
                continue
            job.reported_size = size
            events.append(Event("output", now, "", job.booking_id, log_tail=tail))
        return events

    def _sweep_cgroups(self) -> None:
        sweep = getattr(self._confinement, "sweep", None)
        if sweep is not None:
            gone = sweep({job.confinement for job in self.jobs.values() if job.confinement})
            if gone:
                log.info("removed %d empty job cgroup(s) an earlier agent left", gone)

    def reconcile(self, bookings: list[DesiredBooking] | None, now: datetime) -> list[Event]:
        """One step towards the desired bookings; None (never pulled yet) launches/stops nothing
        but bookings that passed their end."""
        events = self._reap(now)
        self._stop_unwanted(bookings, now)
        self._warn(now)
        self._escalate()
        events += self._sessions_ready(now)
        if bookings is not None:
            events += [self._launch(b, now) for b in bookings if self._should_launch(b, now)]
            wanted = {b.booking_id for b in bookings}
            self._done = {pk: run for pk, run in self._done.items() if pk in wanted}
        if events or self._dirty:
            self.save()
        return events

    def _should_launch(self, booking: DesiredBooking, now: datetime) -> bool:
        return (
            bool(booking.command or booking.interactive)
            and booking.start <= now < booking.end
            and booking.booking_id not in self.jobs
            and self._done.get(booking.booking_id, -1) < booking.restart_count
            # Several nodes meet on the port the portal hands out; none starts without it.
            and not (len(booking.nodes) > 1 and booking.master_port is None)
        )

    def _stop_unwanted(self, bookings: list[DesiredBooking] | None, now: datetime) -> None:
        wanted = None if bookings is None else {b.booking_id: b for b in bookings}
        for job in self.jobs.values():
            if job.stop_reason is not None:
                continue
            if wanted and job.booking_id in wanted:
                self._follow_end(job, wanted[job.booking_id].end)
                if set(job.device_uuids) != set(wanted[job.booking_id].device_uuids):
                    # The portal moved the booking (e.g. requeued while this node was away):
                    # the work must not stay on devices the booking no longer holds.
                    job.relaunch = True
                    self._begin_stop(job, "the booking moved to other devices; relaunching there")
                    continue
            if datetime.fromisoformat(job.end) <= now:
                self._begin_stop(job, "the booking's end time passed")
            elif wanted is not None and job.booking_id not in wanted:
                self._begin_stop(
                    job,
                    "the booking is no longer active (cancelled, ended or preempted)",
                    early=True,
                )

    def _follow_end(self, job: Job, end: datetime) -> None:
        # Bookings get extended (or shortened); a restart must not stop at a stale end.
        if job.end != end.isoformat():
            job.end = end.isoformat()
            if job.job_dir:
                try:
                    jobenv.write_end(_files(job), job.end)
                except OSError as exc:  # the job runs on; only its end file is stale
                    log.warning("booking %s: cannot rewrite its end file: %s", job.booking_id, exc)
            job.warned = False  # a new end: warn again before it
            self._dirty = True

    def _warn(self, now: datetime) -> None:
        # The booking's signal, warn_before_s before its end (Slurm's --signal=SIG@seconds).
        for job in self.jobs.values():
            if job.warn_signal is None or job.warned or job.stop_reason is not None:
                continue
            if (datetime.fromisoformat(job.end) - now).total_seconds() <= job.warn_before_s:
                self._send_warning(job)

    def _send_warning(self, job: Job) -> None:
        log.info("booking %s: SIG%s before its end", job.booking_id, job.warn_signal)
        job.warned = True
        self._dirty = True
        _signal_group(job, jobenv.signal_number(job.warn_signal))

    def _sessions_ready(self, now: datetime) -> list[Event]:
        events = []
        for job in self.jobs.values():
            if job.session_port is None or job.session_ready or job.stop_reason is not None:
                continue
            if session_listening(job.session_host or DEFAULT_HOST, job.session_port):
                job.session_ready = True
                events.append(_session_event("session_ready", job, now, "the session is ready"))
        return events

    def _begin_stop(self, job: Job, reason: str, *, early: bool = False) -> None:
        log.info("stopping booking %s (pgid %s): %s", job.booking_id, job.pgid, reason)
        job.stop_reason = reason
        if early and job.warn_signal is not None and not job.warned:
            # Stopped before its end (preempted, cancelled): the warning first, SIGTERM one
            # grace later, so the job can checkpoint as it would before its end.
            self._send_warning(job)
            job.term_at = self._clock() + self._kill_wait(job)
            return
        self._terminate(job)

    def _kill_wait(self, job: Job) -> float:
        return self._grace_s if job.kill_wait_s is None else job.kill_wait_s

    def _terminate(self, job: Job) -> None:
        job.term_at = None
        job.kill_at = self._clock() + self._kill_wait(job)
        _signal_group(job, signal.SIGTERM)

    def _escalate(self) -> None:
        for job in self.jobs.values():
            if job.term_at is not None and self._clock() >= job.term_at:
                self._terminate(job)
            if job.kill_at is not None and self._clock() >= job.kill_at:
                log.warning("booking %s ignored SIGTERM; sending SIGKILL", job.booking_id)
                _signal_group(job, signal.SIGKILL)
                job.kill_at = None

    def _reap(self, now: datetime, *, away: bool = False) -> list[Event]:
        events = []
        for job in list(self.jobs.values()):
            exited, code = job.exit_code()
            if exited:
                events.append(self._finished(job, code, now, away=away))
        return events

    def _finished(self, job: Job, code: int | None, now: datetime, *, away: bool) -> Event:
        del self.jobs[job.booking_id]
        if job.shared_gpu and self._mps is not None:
            self._mps.leave(job.booking_id)
        shutil.rmtree(self._state_dir / "sessions" / f"booking-{job.booking_id}", True)
        oom = job.memory_mib is not None and handles.job_oom_killed(job.confinement, code)
        confine.release(job.confinement)  # what the job left behind in its cgroup dies with it
        tail = log_tail(_output_source(job))
        if job.job_dir:
            shutil.rmtree(job.job_dir, True)
        if not job.relaunch:
            self._done[job.booking_id] = job.restart
        interrupted: Interruption | None = None
        if job.agent_stopped or job.stop_reason is not None:
            # Stragglers in the group must not keep the GPU after the booking ended.
            _signal_group(job, signal.SIGKILL)
            container_remove(job.container, job.unix_user)
            kind, detail = "stopped", f"stopped: {job.stop_reason}"
            if job.agent_stopped:
                detail, interrupted = f"stopped: {AGENT_STOPPED}", "agent_stopped"
        elif job.popen is None and code is None:
            kind, detail, interrupted = "exited", f"ended unwatched: {UNWATCHED}", "unwatched"
        else:
            kind = "exited"
            detail = _exit_detail(job, away)
        if oom and kind == "exited" and interrupted is None:
            detail = oom_reason(job.memory_mib)
        return Event(
            kind,
            now,
            detail,
            job.booking_id,
            code,
            tail,
            pid=job.pid,
            user=job.unix_user,
            session_host=job.session_host,
            session_port=job.session_port,
            interrupted=interrupted,
            oom_limit_mib=job.memory_mib if oom and kind == "exited" and not interrupted else None,
        )

    def _launch(self, booking: DesiredBooking, now: datetime) -> Event:
        unix_user = self.unix_user(booking.owner)
        try:
            account = pwd.getpwnam(unix_user)
        except KeyError:
            self._done[booking.booking_id] = booking.restart_count
            detail = (
                f"not launched: Unix user {unix_user!r} (portal user {booking.owner!r}) "
                "does not exist on this node"
            )
            return Event("exited", now, detail, booking.booking_id, user=unix_user)
        if account.pw_uid < self._min_uid:
            self._done[booking.booking_id] = booking.restart_count
            detail = (
                f"not launched: Unix user {unix_user!r} has uid {account.pw_uid}, below the "
                f"minimum uid {self._min_uid} for jobs (root and system accounts never run jobs)"
            )
            log.warning("booking %s %s", booking.booking_id, detail)
            return Event("exited", now, detail, booking.booking_id, user=unix_user)
        try:
            job, note = self._spawn(booking, account)
        except (OSError, confine.ConfinementError) as exc:
            self._done[booking.booking_id] = booking.restart_count
            detail = f"not launched: {exc}"
            log.warning("booking %s %s", booking.booking_id, detail)
            return Event("exited", now, detail, booking.booking_id, user=unix_user)
        self.jobs[booking.booking_id] = job
        detail = f"launched as {unix_user} on {','.join(booking.device_uuids)}; {note}"
        return _session_event("started", job, now, detail)

    def _spawn(self, booking: DesiredBooking, account: pwd.struct_passwd) -> tuple[Job, str]:
        mps = self._mps is not None and sharing.is_shared(booking)
        share_env = sharing.share_variables(booking)
        if mps:
            share_env |= self._mps.join(booking)
        try:
            job, note = self._spawn_shared(booking, account, share_env)
        except BaseException:
            if mps:
                self._mps.leave(booking.booking_id)
            raise
        job.shared_gpu = booking.device_uuids[0] if mps else None
        return job, note

    def _spawn_shared(
        self, booking: DesiredBooking, account: pwd.struct_passwd, share_env: dict[str, str]
    ) -> tuple[Job, str]:
        log_path = self._log_dir / f"booking-{booking.booking_id}.log"
        argv, extra_env, session, files, container = [], dict(share_env), None, None, None
        held = self._limits(booking)
        if not booking.interactive:
            files = jobenv.job_files(self._state_dir, booking, account, self._default_workdir)
            nodes = jobenv.placement(booking, self._hostname, self._address)
            port = booking.master_port or free_port(DEFAULT_HOST)
            extra_env = jobenv.launch_variables(booking, files, nodes, port) | share_env
            run = None  # the command itself, unless it runs in a container image
            if booking.image:
                launched = self._container(booking, account, files.workdir, extra_env, held)
                run, container = launched.argv, launched.handle
                extra_env = extra_env | launched.env
            agent_env = _job_environment(booking, account) | extra_env
            argv = jobenv.write_job_files(
                booking,
                files,
                nodes,
                run=run,
                owner=(account.pw_uid, account.pw_gid),
                agent_env=agent_env,
            )
        else:
            session = session_launch(
                booking,
                host=self._session_host,
                python=self._session_python,
                home=self._session_dir or _home(account),
                as_root=account.pw_uid == 0,
                workspaces=self._session_workspaces(booking.booking_id, account),
            )
            argv, extra_env = session.argv, session.env | share_env
        launch = self._confinement.wrap(
            booking.booking_id,
            argv,
            account,
            self._device_files(list(booking.device_uuids)),
            held,
        )
        try:
            # A batch job's shell reads its launch script on stdin (agents.jobenv).
            script = open(files.script, "rb") if files else open(os.devnull, "rb")
            with script, open(log_path, "ab") as log_file:
                if os.geteuid() == 0:
                    os.chown(log_path, account.pw_uid, account.pw_gid)  # the owner may read it
                popen = subprocess.Popen(
                    launch.argv,
                    stdin=script,
                    stdout=log_file,
                    stderr=subprocess.STDOUT,
                    env=_job_environment(booking, account) | extra_env,
                    cwd=_home(account),
                    start_new_session=True,
                    **(_identity(account) if launch.drop_privileges else {}),
                )
        except OSError:
            confine.release(launch.handle)
            raise
        if launch.argv != argv and _program(launch.argv[0]) != _program(argv[0]):
            # A wrapper (jail, systemd-run) runs as root first: report the job, and let the
            # enforcer see it, only once it is the command, as its user, in its cgroup.
            _await_exec(popen, launch.argv[0])
        stat = read_stat(popen.pid)
        job = Job(
            booking.booking_id,
            account.pw_name,
            list(booking.device_uuids),
            booking.end.isoformat(),
            popen.pid,
            popen.pid,
            stat.start_ticks if stat else 0,
            str(log_path),
            popen,
            confinement=launch.handle,
            session_host=session.host if session else None,
            session_port=session.port if session else None,
            output_path=files.output if files else None,
            uid=account.pw_uid,
            job_dir=str(files.directory) if files else None,
            warn_signal=booking.warn_signal,
            warn_before_s=booking.warn_before_s,
            kill_wait_s=booking.kill_wait_s,
            container=container,
            restart=booking.restart_count,
            cpu_list=format_cpulist(held.cpu_list) if held and held.cpu_list else None,
            memory_mib=held.memory_mib if held else None,
        )
        return job, launch.note

    def _limits(self, booking: DesiredBooking) -> limits.JobLimits | None:
        """The booking's cores and memory on this node (None: it has none, an older portal):
        cores no other running job holds, near its GPUs."""
        if self._machine is None:
            return None
        taken = {
            c for job in self.jobs.values() if job.cpu_list for c in parse_cpulist(job.cpu_list)
        }
        near = {self._gpu_numa[u] for u in booking.device_uuids if u in self._gpu_numa}
        try:
            return limits.job_limits(booking, self._machine, taken, near)
        except HostError as exc:
            raise confine.ConfinementError(str(exc)) from None

    def _container(
        self,
        booking: DesiredBooking,
        account: pwd.struct_passwd,
        workdir: str,
        launch_env: dict[str, str],
        held: limits.JobLimits | None = None,
    ) -> ContainerLaunch:
        """The container launch of a booking that names an image (NoRuntime: none fits). The
        launch script exports the booking's own variables before it execs the runtime, which
        passes them in by name with the job's and the launch variables."""
        return container_launch(
            runtimes=self.container_runtimes,
            booking_id=booking.booking_id,
            image=booking.image or "",
            command=booking.command or "",
            device_uuids=list(booking.device_uuids),
            uid=account.pw_uid,
            gid=account.pw_gid,
            env=_job_environment(booking, account)
            | launch_env
            | {v.name: v.value for v in booking.env if not job_env_reserved(v.name)},
            workdir=workdir,
            extra_args=self._container_args,
            inject_devices=self._container_devices,
            resources=limits.oci_options(held),
        )

    def _session_workspaces(self, booking_id: int, account: pwd.struct_passwd) -> Path:
        directory = self._state_dir / "sessions" / f"booking-{booking_id}"
        directory.mkdir(parents=True, exist_ok=True)
        if os.geteuid() == 0:
            os.chown(directory, account.pw_uid, account.pw_gid)  # JupyterLab saves layouts here
        return directory

    def stop_over_share(self, booking_id: int, reason: str) -> bool:
        """Stop `booking_id`'s job for going over its share of a shared GPU: a line in its
        output says why, then SIGTERM (SIGKILL after its kill wait). False: no such job runs,
        or it is being stopped already."""
        job = self.jobs.get(booking_id)
        if job is None or job.stop_reason is not None:
            return False
        _note(job, f"gpu-portal: stopping the job: it {reason}")
        self._begin_stop(job, reason)
        self._dirty = True
        return True

    def stop_all(self, grace_s: float, now: datetime) -> list[Event]:
        """Stop every launched command now: SIGTERM to its group, SIGKILL after `grace_s`; the
        events that say the agent stopped them (Event.interrupted "agent_stopped").

        The state file keeps them, marked so: until `save()` is called again (once the events
        are sent), the next agent reports them, stopped by the agent, not as plain exits.
        """
        for job in self.jobs.values():
            job.agent_stopped = True
        self.save()
        for job in self.jobs.values():
            _signal_group(job, signal.SIGTERM)
        deadline = time.monotonic() + grace_s
        while time.monotonic() < deadline and not all(j.exit_code()[0] for j in self.jobs.values()):
            time.sleep(0.05)
        for job in self.jobs.values():  # those that ignored SIGTERM, and stragglers in the group
            _signal_group(job, signal.SIGKILL)
        deadline = time.monotonic() + 1.0  # SIGKILL is not refused: only the reaping remains
        while time.monotonic() < deadline and not all(j.exit_code()[0] for j in self.jobs.values()):
            time.sleep(0.01)
        return self._reap(now)

    def save(self) -> None:
        """Write the state file (after every change, and on agent shutdown)."""
        state = {
            "jobs": [job.persisted() for job in self.jobs.values()],
            "done": sorted([booking_id, run] for booking_id, run in self._done.items()),
        }
        path = self._state_dir / _STATE_FILE
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(state, indent=1))
        os.replace(tmp, path)  # a crash mid-write must not lose the running jobs
        self._dirty = False


def _exit_detail(job: Job, away: bool) -> str:
    if job.popen is not None:
        return "exited"
    if away:
        return "exited while no agent watched it (status from its exit file)"
    return "exited (re-adopted after an agent restart)"


def _output_source(job: Job) -> str:
    # The job's own output file once it made one (its user's, no symlink), else the agent's
    # log of the launch (where a working directory that cannot be entered says so).
    if job.output_path and job.uid is not None:
        return jobenv.owned_output(job.output_path, job.uid) or job.log_path
    return job.log_path


def _note(job: Job, line: str) -> None:
    """Append `line` to the job's output, as the job's user when it is the job's own file (the
    agent never writes the working directory's files as root), else to the agent's log of it."""
    path = _output_source(job)
    try:
        if path != job.log_path and job.uid is not None and job.uid != os.geteuid():
            account = pwd.getpwuid(job.uid)
            subprocess.run(
                [jobenv.SHELL, "-c", 'printf "%s\\n" "$1" >>"$2"', jobenv.SHELL, line, path],
                user=account.pw_uid,
                group=account.pw_gid,
                extra_groups=[],
                env={"PATH": "/usr/bin:/bin"},
                timeout=5,
                check=False,
            )
            return
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_NOFOLLOW)
        with os.fdopen(fd, "a") as out:
            out.write(line + "\n")
    except (OSError, KeyError, subprocess.TimeoutExpired) as exc:
        log.warning("booking %s: could not note %r in its output: %s", job.booking_id, line, exc)


def _files(job: Job) -> jobenv.JobFiles:
    return jobenv.JobFiles(Path(job.job_dir or ""), "", job.output_path or "")


def _home(account: pwd.struct_passwd) -> str:
    return account.pw_dir if os.path.isdir(account.pw_dir) else "/"


def _session_event(kind: str, job: Job, now: datetime, detail: str) -> Event:
    return Event(
        kind,
        now,
        detail,
        job.booking_id,
        pid=job.pid,
        user=job.unix_user,
        session_host=job.session_host,
        session_port=job.session_port,
    )


def _identity(account: pwd.struct_passwd) -> dict:
    # Dropping privileges only works (and is only needed) when running as someone else.
    if account.pw_uid == os.geteuid():
        return {}
    groups = os.getgrouplist(account.pw_name, account.pw_gid)
    return {"user": account.pw_uid, "group": account.pw_gid, "extra_groups": groups}


def _job_environment(booking: DesiredBooking, account: pwd.struct_passwd) -> dict[str, str]:
    # A fresh environment: the agent's own (with the node token) must not leak into jobs.
    return (
        _array_environment(booking)
        | {
            "CUDA_VISIBLE_DEVICES": ",".join(booking.device_uuids),
            "GPU_PORTAL_BOOKING_ID": str(booking.booking_id),
            "HOME": account.pw_dir,
            "USER": account.pw_name,
            "LOGNAME": account.pw_name,
            "SHELL": account.pw_shell or "/bin/sh",
            "PATH": "/usr/local/bin:/usr/bin:/bin",
        }
        | limits.job_env(booking)
    )


def _array_environment(booking: DesiredBooking) -> dict[str, str]:
    """Slurm's SLURM_ARRAY_JOB_ID / SLURM_ARRAY_TASK_ID, under the portal's names."""
    if booking.array_task_id is None:
        return {}
    return {
        "GPU_PORTAL_ARRAY_JOB_ID": str(booking.array_job_id),
        "GPU_PORTAL_ARRAY_TASK_ID": str(booking.array_task_id),
    }


def _await_exec(popen: subprocess.Popen, wrapper: str) -> None:
    # /proc/<pid>/exe names the running program: wait until it is no longer the wrapper.
    # (A wrapper that is the same program as the command, python for both, cannot be told apart.)
    target = _program(wrapper)
    deadline = time.monotonic() + _EXEC_WAIT_S
    while popen.poll() is None and time.monotonic() < deadline:
        try:
            if os.path.realpath(os.readlink(f"/proc/{popen.pid}/exe")) != target:
                return
        except OSError:
            return  # gone (or exiting) already
        time.sleep(0.002)
    if popen.poll() is None:
        log.warning("pid %s still runs %s after %.0f s", popen.pid, wrapper, _EXEC_WAIT_S)


def _program(name: str) -> str:
    return os.path.realpath(shutil.which(name) or name)


def _signal_group(job: Job, signum: int) -> None:
    try:
        os.killpg(job.pgid, signum)
    except (ProcessLookupError, PermissionError):
        pass  # already gone


def log_tail(path: str, size: int = LOG_TAIL_BYTES) -> str | None:
    """The last `size` bytes of a log as text, or None when the log is missing."""
    try:
        with open(path, "rb") as f:
            f.seek(max(0, os.path.getsize(path) - size))
            return f.read().decode(errors="replace")
    except OSError:
        return None


def active_bookings(bookings: Iterable[DesiredBooking], now: datetime) -> list[DesiredBooking]:
    """The bookings that hold their devices at `now`."""
    return [b for b in bookings if b.start <= now < b.end]
