"""Database errors that reach the API answer JSON in the one error shape, never an HTML 500.

The views below are this module's own (ROOT_URLCONF points here): each does a real write that
the database refuses, as a service missing a check would, through the project's DRF settings
and exception handler.
"""

import pytest
from django.db import transaction
from django.db.models import RestrictedError
from django.urls import path
from rest_framework.permissions import AllowAny
from rest_framework.response import Response
from rest_framework.test import APIClient
from rest_framework.views import APIView

from portal.models import Gpu, Node
from tests.conftest import error_of
from tests.factories import make_active_booking, make_node

pytestmark = pytest.mark.django_db


class _Open(APIView):
    authentication_classes: list = []
    permission_classes = [AllowAny]


class DeleteGpuView(_Open):
    def delete(self, request, pk):
        Gpu.objects.get(pk=pk).delete()  # a GPU with bookings is PROTECTed by its allocations
        return Response(status=204)


class RestrictedView(_Open):
    def delete(self, request):
        # No model uses on_delete=RESTRICT yet; Django raises this for one that would.
        raise RestrictedError("Cannot delete the node: restricted by its GPUs.", set())


class OutOfRangeView(_Open):
    def post(self, request):
        node = Node.objects.get(hostname="err-node")
        with transaction.atomic():
            Gpu.objects.create(node=node, index=40000, uuid="GPU-far", model="X", memory_mib=1)
        return Response(status=201)


class DuplicateView(_Open):
    def post(self, request):
        with transaction.atomic():
            Node.objects.create(hostname="err-node")
        return Response(status=201)


urlpatterns = [
    path("gpus/<int:pk>/", DeleteGpuView.as_view()),
    path("restricted/", RestrictedView.as_view()),
    path("out-of-range/", OutOfRangeView.as_view()),
    path("duplicate/", DuplicateView.as_view()),
]


@pytest.fixture
def http(settings):
    settings.ROOT_URLCONF = __name__
    return APIClient(raise_request_exception=False)


@pytest.fixture
def node(db):
    return make_node("err-node", gpus=1)


def test_it_answers_409_protected_when_a_delete_would_lose_history(http, node):
    gpu = node.gpus.get()
    make_active_booking([gpu])
    response = http.delete(f"/gpus/{gpu.pk}/")
    assert response.status_code == 409
    assert response["Content-Type"] == "application/json"
    error = error_of(response)
    assert error["code"] == "protected"
    assert "Allocation.gpu" in error["message"]
    assert Gpu.objects.filter(pk=gpu.pk).exists()


def test_it_answers_409_protected_for_a_restricted_delete(http):
    response = http.delete("/restricted/")
    assert response.status_code == 409
    assert error_of(response)["code"] == "protected"


def test_it_answers_400_invalid_when_a_value_does_not_fit_its_column(http, node):
    response = http.post("/out-of-range/")
    assert response.status_code == 400
    error = error_of(response)
    assert error["code"] == "invalid"
    assert "out of range" in error["message"]
    assert not Gpu.objects.filter(uuid="GPU-far").exists()


def test_it_answers_409_conflict_naming_the_field_of_a_unique_violation(http, node):
    response = http.post("/duplicate/")
    assert response.status_code == 409
    error = error_of(response)
    assert error["code"] == "conflict"
    assert error["fields"] == {"hostname": "already taken"}
    assert Node.objects.filter(hostname="err-node").count() == 1
