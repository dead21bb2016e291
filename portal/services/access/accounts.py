"""The site's first administrator, from the environment (docker compose, first start)."""

from django.contrib.auth import get_user_model
from django.contrib.auth.password_validation import validate_password
from django.db import transaction


def admin_ensure(*, username: str, email: str, password: str) -> bool:
    """Create superuser `username` unless a user of that name exists; True when it was created.

    An existing account is left alone (its password may have been changed since), so running
    this on every start is safe. The password must pass the site's password validators.
    """
    User = get_user_model()
    if User.objects.filter(username=username).exists():
        return False
    user = User(username=username, email=email, is_staff=True, is_superuser=True)
    validate_password(password, user)
    user.set_password(password)
    user.full_clean(exclude=["password"])
    with transaction.atomic():
        user.save()
    return True
