"""FilterSets shared by the API and the web pages (NetBox style)."""

import django_filters

from portal.models import Booking, Gpu, MigInstance, Node


class NodeFilterSet(django_filters.FilterSet):
    class Meta:
        model = Node
        fields = {"hostname": ["exact", "icontains"], "state": ["exact"]}


class GpuFilterSet(django_filters.FilterSet):
    node = django_filters.CharFilter(field_name="node__hostname")

    class Meta:
        model = Gpu
        fields = {"model": ["exact"], "mig_mode": ["exact"], "uuid": ["exact"]}


class MigInstanceFilterSet(django_filters.FilterSet):
    node = django_filters.CharFilter(field_name="gpu__node__hostname")
    model = django_filters.CharFilter(field_name="gpu__model")

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
