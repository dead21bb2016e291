"""Data model of the portal, one module per domain (inventory, projects, bookings, ...),
re-exported here so callers import from portal.models."""

from portal.models.audit import AuditEvent
from portal.models.bookings import Allocation, Booking, BookingDependency, Qos
from portal.models.fairshare import FairshareUsage
from portal.models.inventory import Gpu, MigInstance, Node, NodeHeartbeat, mig_fraction
from portal.models.maintenance import MaintenanceWindow
from portal.models.mig_layouts import MigLayoutChange
from portal.models.notifications import (
    ActionUse,
    Channel,
    Delivery,
    Event,
    IdleReclaim,
    Notification,
    NotificationContact,
    NotificationPreference,
    ProjectNotificationSettings,
)
from portal.models.outbox import DomainEvent
from portal.models.projects import Membership, Project, Quota
from portal.models.reservations import ProjectReservation
from portal.models.runs import NodeRun
from portal.models.sso import GroupMappingRule
from portal.models.telemetry import NodeAlert, ProcessUsage, Sample, SampleMinute
from portal.models.tokens import ApiToken

__all__ = [
    "ActionUse",
    "Channel",
    "Delivery",
    "DomainEvent",
    "FairshareUsage",
    "Event",
    "IdleReclaim",
    "Notification",
    "NotificationContact",
    "NotificationPreference",
    "ProjectNotificationSettings",
    "Allocation",
    "ApiToken",
    "AuditEvent",
    "Booking",
    "BookingDependency",
    "Gpu",
    "GroupMappingRule",
    "MaintenanceWindow",
    "Membership",
    "MigInstance",
    "MigLayoutChange",
    "Node",
    "NodeHeartbeat",
    "NodeAlert",
    "NodeRun",
    "ProcessUsage",
    "Project",
    "ProjectReservation",
    "Qos",
    "Quota",
    "Sample",
    "SampleMinute",
    "mig_fraction",
]
