"""The browser pages' routes, in one visible list."""

from django.urls import path

from portal.web import actions, mail, notify, overview_page, tokens, views

urlpatterns = [
    path("", overview_page.overview, name="overview"),
    path("bookings/", views.bookings, name="bookings"),
    path("bookings/<int:booking_id>/", views.booking_detail, name="booking-detail"),
    path("bookings/<int:booking_id>/cancel/", actions.booking_cancel, name="booking-cancel"),
    path("bookings/<int:booking_id>/release/", actions.booking_release, name="booking-release"),
    path("bookings/<int:booking_id>/extend/", actions.booking_extend, name="booking-extend"),
    path("book/", actions.book, name="book"),
    path("calendar/", views.calendar_page, name="calendar"),
    path("favicon.ico", views.favicon, name="favicon"),
    path("queue/", views.queue, name="queue"),
    path("staff/", views.staff_panel, name="staff"),
    path("staff/mail/", mail.mail_list, name="staff-mail"),
    path("staff/mail/<str:name>/", mail.mail_detail, name="staff-mail-detail"),
    path("gpus/<int:gpu_id>/", views.gpu_detail, name="gpu-detail"),
    path("projects/<slug:slug>/", views.project_detail, name="project"),
    path("accounting/", views.accounting, name="accounting"),
    path("tokens/", tokens.tokens, name="tokens"),
    path("tokens/<int:token_id>/revoke/", tokens.token_revoke, name="token-revoke"),
    path("audit/", tokens.audit, name="audit"),
    path("actions/<str:token>/", notify.booking_action, name="booking-action"),
    path("slack/interactivity/", notify.slack_interactivity, name="slack-interactivity"),
    path("settings/notifications/", notify.notification_settings, name="notification-settings"),
]
