from django.urls import path

from portal.web import views

urlpatterns = [
    path("", views.overview, name="overview"),
]
