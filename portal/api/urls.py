"""The API's routes, in one visible list."""

from django.urls import include, path
from drf_spectacular.views import SpectacularAPIView, SpectacularSwaggerView
from rest_framework.routers import DefaultRouter

from portal.api import schema, views  # noqa: F401  (schema registers the auth extension)

router = DefaultRouter()
router.register("nodes", views.NodeViewSet, basename="node")
router.register("gpus", views.GpuViewSet, basename="gpu")
router.register("mig-instances", views.MigInstanceViewSet, basename="mig-instance")
router.register("bookings", views.BookingViewSet, basename="booking")
router.register("auth/tokens", views.TokenViewSet, basename="token")

urlpatterns = [
    path("api/v1/auth/token/", views.TokenCreateView.as_view(), name="token-create"),
    path("api/v1/me/quota/", views.MyQuotaView.as_view(), name="my-quota"),
    path("api/v1/", include(router.urls)),
    path("api/schema/", SpectacularAPIView.as_view(), name="schema"),
    path("api/docs/", SpectacularSwaggerView.as_view(url_name="schema"), name="api-docs"),
]
