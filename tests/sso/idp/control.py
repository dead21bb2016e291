"""Set up the test provider's database: `python -m tests.sso.idp.control COMMAND ...`.

setup CLIENT_ID SECRET          migrate, make a signing key and a confidential client
redirect CLIENT_ID URI          allow one more redirect URI for the client
user NAME PASSWORD [GROUP ...]  create or update a user and set its groups
"""

import os
import sys

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "tests.sso.idp.settings")


def main(command: str, *args: str) -> None:
    import django

    django.setup()
    from django.contrib.auth.models import Group, User
    from django.core.management import call_command
    from oidc_provider.models import Client, ResponseType

    if command == "setup":
        client_id, secret = args
        call_command("migrate", verbosity=0)
        call_command("creatersakey")
        client = Client.objects.create(
            name="GPU Portal",
            client_type="confidential",
            client_id=client_id,
            client_secret=secret,
            jwt_alg="RS256",
            require_consent=False,
        )
        client.response_types.set(ResponseType.objects.filter(value="code"))
    elif command == "redirect":
        client_id, uri = args
        client = Client.objects.get(client_id=client_id)
        client.redirect_uris = [*client.redirect_uris, uri]
        client.save()
    elif command == "user":
        name, password, *groups = args
        user, _ = User.objects.get_or_create(username=name)
        user.set_password(password)
        user.email = f"{name}@idp.example.org"
        user.first_name = name.capitalize()
        user.save()
        user.groups.set([Group.objects.get_or_create(name=group)[0] for group in groups])
    else:
        raise SystemExit(__doc__)


if __name__ == "__main__":
    main(*sys.argv[1:])
