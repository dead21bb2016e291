"""Fixtures for the portal side of the node agent: nodes with tokens, an agent's HTTP client."""

import getpass
import json

import pytest
from rest_framework.test import APIClient

from agents import protocol
from tests.factories import ProjectFactory, QuotaFactory, UserFactory, make_agent_node, member


class AgentClient:
    """Speaks to the agent endpoints as one node would (raw JSON bodies, bearer token)."""

    def __init__(self, token: str):
        self.http = APIClient()
        self.http.credentials(HTTP_AUTHORIZATION=f"Bearer {token}")

    def post(self, path: str, body):
        raw = body if isinstance(body, str | bytes) else json.dumps(body)
        return self.http.post(path, data=raw, content_type="application/json")

    def get(self, path: str):
        return self.http.get(path)

    def readings(self, hostname: str, readings: list[dict], time: str = "2026-01-01T00:00:00Z"):
        return self.post(
            protocol.READINGS_PATH, {"hostname": hostname, "time": time, "readings": readings}
        )

    def events(self, *events: dict):
        return self.post(protocol.EVENTS_PATH, {"events": list(events)})


def reading(uuid: str, **values) -> dict:
    """A device reading as an agent sends it; MIG-like (nulls) unless values are given."""
    body = {
        "uuid": uuid,
        "utilization_gpu": None,
        "utilization_memory": None,
        "memory_used_mib": 512,
        "memory_total_mib": 40960,
        "temperature_c": None,
        "power_w": None,
        "processes": [],
    }
    body.update(values)
    return body


@pytest.fixture
def node_a(db):
    """node-a: two whole GPUs and one GPU in MIG mode (4 instances); (node, token)."""
    return make_agent_node("node-a", gpus=2, mig_gpus=1)


@pytest.fixture
def alice(db):
    """alice, a member of vision (up to 16 GPUs): the owner of the session tests' bookings."""
    user = UserFactory(username="alice")
    project = ProjectFactory(slug="vision")
    member(user, project)
    QuotaFactory(project=project, max_gpus=16)
    return user


@pytest.fixture
def node_b(db):
    return make_agent_node("node-b", gpus=1)


@pytest.fixture
def agent_a(node_a):
    return AgentClient(node_a[1])


@pytest.fixture
def allocation_passes(monkeypatch):
    """Record requested allocation passes instead of running the allocator (not under test)."""
    from portal import tasks

    requested: list[int] = []
    monkeypatch.setattr(tasks.allocation_pass, "delay", lambda: requested.append(1))
    return requested


@pytest.fixture
def real_agents(live_server, tmp_path):
    """Make real agents (agents.agent.Agent, simulated backend) talking to the live portal over
    HTTP: `make(hostname, spec)`. Their jobs run as whoever runs the suite; all are killed after."""
    from agents.agent import Agent
    from agents.simulate import SimulatedBackend
    from portal.services.fleet.nodes import node_token_issue

    made: list = []
    tokens: dict[str, str] = {}
    workdir = tmp_path / "work"
    workdir.mkdir()

    def make(hostname: str, spec: str, **options):
        if hostname not in tokens:  # issuing another would revoke the first agent's
            tokens[hostname] = node_token_issue(hostname=hostname)
        token = tokens[hostname]
        agent = Agent(
            live_server.url,
            token,
            SimulatedBackend(spec, hostname, seed=1),
            hostname=hostname,
            state_dir=tmp_path / "state" / hostname,  # each node its own
            user_map={"alice": getpass.getuser()},
            report_interval_s=0.2,
            sync_interval_s=0.2,
            grace_s=1.0,
            push=False,
            min_uid=0,  # jobs run as whoever runs the suite, root included
            default_workdir=str(workdir),  # their gpu-portal-<id>.out: not in the home
            address="127.0.0.1",  # every simulated node is this machine (MASTER_ADDR)
            **options,
        )
        agent.start()
        made.append(agent)
        return agent

    yield make
    for agent in made:
        for job in agent.dispatcher.jobs.values():
            if job.popen is not None and job.popen.poll() is None:
                job.popen.kill()
                job.popen.wait()
