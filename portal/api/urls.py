"""The API's routes, in one visible list."""

from django.urls import include, path
from drf_spectacular.views import SpectacularAPIView, SpectacularSwaggerSplitView
from rest_framework.routers import DefaultRouter

from agents import protocol
from portal.api import (  # noqa: F401  (schema registers the auth extension)
    agent,
    history,
    maintenance,
    mig_layouts,
    notifications,
    reservations,  # noqa: F401  (schema registers the auth extension)
    schema,
    views,
)

router = DefaultRouter()
router.register("nodes", views.NodeViewSet, basename="node")
router.register("gpus", views.GpuViewSet, basename="gpu")
router.register("mig-instances", views.MigInstanceViewSet, basename="mig-instance")
router.register("bookings", views.BookingViewSet, basename="booking")
router.register("auth/tokens", views.TokenViewSet, basename="token")
router.register("maintenance", maintenance.MaintenanceViewSet, basename="maintenance")
router.register(
    "mig-layout-changes", mig_layouts.MigLayoutChangeViewSet, basename="mig-layout-change"
)
router.register("reservations", reservations.ReservationViewSet, basename="reservation")

# Agent endpoints: the paths are part of the wire protocol (agents/protocol.py).
agent_urlpatterns = [
    path(protocol.REGISTER_PATH.lstrip("/"), agent.RegisterView.as_view(), name="agent-register"),
    path(protocol.READINGS_PATH.lstrip("/"), agent.ReadingsView.as_view(), name="agent-readings"),
    path(protocol.DESIRED_PATH.lstrip("/"), agent.DesiredView.as_view(), name="agent-desired"),
    path(protocol.EVENTS_PATH.lstrip("/"), agent.EventsView.as_view(), name="agent-events"),
]

urlpatterns = [
    *agent_urlpatterns,
    path("api/v1/auth/token/", views.TokenCreateView.as_view(), name="token-create"),
    path("api/v1/me/quota/", views.MyQuotaView.as_view(), name="my-quota"),
    path(
        "api/v1/me/notifications/",
        notifications.MyNotificationsView.as_view(),
        name="my-notifications",
    ),
    path("api/v1/accounting/", views.AccountingView.as_view(), name="accounting"),
    path("api/v1/audit/", views.AuditView.as_view(), name="audit"),
    path("api/v1/history/", history.SiteHistoryView.as_view(), name="site-history"),
    path(
        "api/v1/gpus/<str:pk>/mig-layout/",
        mig_layouts.GpuMigLayoutView.as_view(),
        name="gpu-mig-layout",
    ),
    path("api/v1/", include(router.urls)),
    path("api/schema/", SpectacularAPIView.as_view(), name="schema"),
    path("api/docs/", SpectacularSwaggerSplitView.as_view(url_name="schema"), name="api-docs"),
]
