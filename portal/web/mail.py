"""Staff pages for the mail `manage.py up` keeps in a folder (portal.mailbox) instead of sending."""

from django.conf import settings
from django.contrib.auth.decorators import login_required
from django.core.exceptions import PermissionDenied
from django.http import Http404
from django.shortcuts import render

from portal.mailbox import mail_folder, mailbox_get, mailbox_list
from portal.services.access import permissions

FOLDER_BACKEND = "portal.mailbox.FolderEmailBackend"


def _staff(request) -> None:
    if not permissions.can(request.user, "staff.panel"):
        raise PermissionDenied("Staff only.")


@login_required
def mail_list(request):
    _staff(request)
    context = {
        "mails": mailbox_list(),
        "folder": mail_folder(),
        "kept": settings.EMAIL_BACKEND == FOLDER_BACKEND,
    }
    return render(request, "portal/staff_mail.html", context)


@login_required
def mail_detail(request, name: str):
    _staff(request)
    mail = mailbox_get(name)
    if mail is None:
        raise Http404("No such message.")
    return render(request, "portal/staff_mail_detail.html", {"mail": mail})
