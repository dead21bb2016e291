"""The endpoints node agents call (paths and bodies: agents/protocol.py, docs/agent-portal.md).

Agents authenticate with `Authorization: Bearer <node token>`; a token speaks only for its own
node. Every authenticated request counts as a heartbeat. Views parse with the shared protocol
module and call one service each.
"""

from django.contrib.auth.models import AnonymousUser
from drf_spectacular.utils import extend_schema
from rest_framework import authentication, exceptions, permissions, status
from rest_framework.response import Response
from rest_framework.views import APIView

from agents import protocol
from portal.api.auth import authorization_key
from portal.models import Node
from portal.services.fleet import agents as agent_services
from portal.services.fleet import selectors as fleet_selectors
from portal.services.fleet.nodes import node_mark_seen
from portal.services.fleet.selectors import node_for_token
from portal.services.fleet.telemetry import samples_ingest


class AgentTokenAuthentication(authentication.BaseAuthentication):
    """`Authorization: Bearer <token>` of a node; request.auth is the Node."""

    keyword = "Bearer"

    def authenticate(self, request):
        raw = authorization_key(request, self.keyword)
        if raw is None:
            return None
        node = node_for_token(raw)
        if node is None:
            raise exceptions.AuthenticationFailed("Invalid or revoked node token.")
        return AnonymousUser(), node

    def authenticate_header(self, request):
        return self.keyword


class IsAgent(permissions.BasePermission):
    def has_permission(self, request, view):
        return isinstance(request.auth, Node)


class AgentView(APIView):
    """Base of the agent endpoints: node-token auth, heartbeat, raw-body protocol parsing."""

    authentication_classes = [AgentTokenAuthentication]
    permission_classes = [IsAgent]
    throttle_classes: list = []

    def initial(self, request, *args, **kwargs):
        super().initial(request, *args, **kwargs)
        node_mark_seen(node=request.auth)

    def parse(self, cls: type):
        return agent_services.agent_message_parse(cls, self.request.body)


class RegisterView(AgentView):
    """POST: the node's inventory; answers the intervals and enforcement policy to use."""

    @extend_schema(request=None, responses={200: None})
    def post(self, request):
        message = self.parse(protocol.RegisterRequest)
        answer = agent_services.agent_register(node=request.auth, request=message)
        return Response(protocol.to_json(answer))


class ReadingsView(AgentView):
    """POST: one sample of every device of the node, stored whole or not at all."""

    @extend_schema(request=None, responses={202: None})
    def post(self, request):
        message = self.parse(protocol.ReadingsRequest)
        accepted = samples_ingest(node=request.auth, request=message)
        answer = protocol.AcceptedResponse(accepted=accepted)
        return Response(protocol.to_json(answer), status=status.HTTP_202_ACCEPTED)


class DesiredView(AgentView):
    """GET: the active bookings on this node's devices and the generation of that state."""

    @extend_schema(request=None, responses={200: None})
    def get(self, request):
        return Response(protocol.to_json(fleet_selectors.agent_desired(node_id=request.auth.pk)))


class EventsView(AgentView):
    """POST: a batch of events (launches, exits, stops, processes objected to)."""

    @extend_schema(request=None, responses={202: None})
    def post(self, request):
        message = self.parse(protocol.EventsRequest)
        accepted = agent_services.agent_events_record(node=request.auth, request=message)
        answer = protocol.AcceptedResponse(accepted=accepted)
        return Response(protocol.to_json(answer), status=status.HTTP_202_ACCEPTED)
