"""FilterSets shared by the API and the web pages: one definition of each filter, so a list
filtered in the browser and through the API answers the same."""

import django_filters
from django.utils import timezone

from portal.models import Booking, Gpu, MigInstance, Node
from portal.services.inventory import selectors as inventory


def _free_filter(free_now):
    """?free=true: bookable devices (inventory.gpus_bookable) held by no booking now on an up
    node; ?free=false: the others."""

    def apply(queryset, name, value):
        free = free_now(queryset, now=timezone.now())
        return free if value else queryset.exclude(id__in=free.values("id"))

    return django_filters.BooleanFilter(method=apply, label="free now")


def _retired_filter(field: str):
    """?retired=true: devices no longer reported (kept for history); ?retired=false: live ones."""

    def apply(queryset, name, value):
        return queryset.filter(**{f"{field}__isnull": not value})

    return django_filters.BooleanFilter(method=apply, label="retired")


class NodeFilterSet(django_filters.FilterSet):
    class Meta:
        model = Node
        fields = {"hostname": ["exact", "icontains"], "state": ["exact"]}


class GpuFilterSet(django_filters.FilterSet):
    node = django_filters.CharFilter(field_name="node__hostname")
    free = _free_filter(inventory.gpus_free_now)
    retired = _retired_filter("retired_at")

    class Meta:
        model = Gpu
        fields = {"model": ["exact"], "mig_mode": ["exact"], "uuid": ["exact"]}


class MigInstanceFilterSet(django_filters.FilterSet):
    node = django_filters.CharFilter(field_name="gpu__node__hostname")
    model = django_filters.CharFilter(field_name="gpu__model")
    free = _free_filter(inventory.mig_instances_free_now)
    retired = _retired_filter("retired_at")

    class Meta:
        model = MigInstance
        fields = {"profile": ["exact"], "uuid": ["exact"]}


class BookingFilterSet(django_filters.FilterSet):
    project = django_filters.CharFilter(field_name="project__slug")
    owner = django_filters.CharFilter(field_name="owner__username")
    state = django_filters.MultipleChoiceFilter(choices=Booking.State.choices)

    class Meta:
        model = Booking
        fields = ["project", "owner", "state", "qos"]
