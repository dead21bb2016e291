"""Real identity servers on loopback for the sign-in tests: an OpenID provider and an LDAP server.

Both run for the whole test session as subprocesses on free ports, with their data in a temporary
folder, and stop at its end. Imported by tests/conftest.py so every test folder can use them.
"""

import os
import shutil
import subprocess
import sys
from dataclasses import dataclass

import pytest

from portal.web.asgi_process import ROOT, free_port, process_start, server_stop

OIDC_CLIENT_ID = "gpu-portal"
OIDC_CLIENT_SECRET = "test-client-secret"
IDP_PASSWORD = "idp-secret-123"


@dataclass
class OidcProvider:
    """The test OpenID provider: its base URL and a way to change its users and client."""

    url: str
    env: dict

    def control(self, *args: str) -> None:
        command = [sys.executable, "-m", "tests.sso.idp.control", *args]
        subprocess.run(command, cwd=ROOT, env=self.env, check=True, capture_output=True)

    def user(self, name: str, *groups: str) -> None:
        """Create or update user `name` (password IDP_PASSWORD) in exactly `groups`."""
        self.control("user", name, IDP_PASSWORD, *groups)

    def allow_redirect(self, uri: str) -> None:
        self.control("redirect", OIDC_CLIENT_ID, uri)

    def portal_env(self, **extra: str) -> dict[str, str]:
        """The portal's environment variables for signing in with this provider."""
        return {
            "OIDC_RP_CLIENT_ID": OIDC_CLIENT_ID,
            "OIDC_RP_CLIENT_SECRET": OIDC_CLIENT_SECRET,
            "OIDC_OP_AUTHORIZATION_ENDPOINT": f"{self.url}/openid/authorize",
            "OIDC_OP_TOKEN_ENDPOINT": f"{self.url}/openid/token",
            "OIDC_OP_USER_ENDPOINT": f"{self.url}/openid/userinfo",
            "OIDC_OP_JWKS_ENDPOINT": f"{self.url}/openid/jwks",
            "OIDC_RP_SCOPES": "openid email profile groups",
            "OIDC_PROVIDER_NAME": "Test IdP",
        } | extra


@pytest.fixture(scope="session")
def oidc_provider(tmp_path_factory):
    """django-oidc-provider serving on 127.0.0.1, with the portal registered as a client."""
    folder = tmp_path_factory.mktemp("oidc-idp")
    env = {key: value for key, value in os.environ.items() if not key.startswith("DJANGO_")} | {
        "DJANGO_SETTINGS_MODULE": "tests.sso.idp.settings",
        "IDP_DB": str(folder / "idp.db"),
    }
    port = free_port()
    provider = OidcProvider(url=f"http://127.0.0.1:{port}", env=env)
    provider.control("setup", OIDC_CLIENT_ID, OIDC_CLIENT_SECRET)
    provider.allow_redirect("http://testserver/oidc/callback/")
    command = [sys.executable, "-m", "django", "runserver", f"127.0.0.1:{port}", "--noreload"]
    with open(folder / "server.log", "wb") as log:
        process = process_start(
            command, port=port, env=env, log=log, timeout=30, name="the test OpenID provider"
        )
    try:
        yield provider
    finally:
        server_stop(process)


LDAP_SUFFIX = "dc=portal,dc=test"
LDAP_ADMIN_DN = f"cn=admin,{LDAP_SUFFIX}"
LDAP_ADMIN_PASSWORD = "ldap-admin-secret"
LDAP_PASSWORD = "ldap-secret-123"
_SLAPD_CONF = """\
include /etc/ldap/schema/core.schema
include /etc/ldap/schema/cosine.schema
include /etc/ldap/schema/inetorgperson.schema
include /etc/ldap/schema/nis.schema
pidfile {folder}/slapd.pid
modulepath /usr/lib/ldap
moduleload back_mdb
database mdb
maxsize 10485760
suffix "{suffix}"
rootdn "{admin}"
rootpw {admin_password}
directory {folder}/data
"""
# Two people and three groups (groupOfNames): one group maps to a project in the tests, one
# does not, and one has nobody the tests sign in as.
_LDIF = """\
dn: {suffix}
objectClass: dcObject
objectClass: organization
dc: portal
o: Portal test directory

dn: ou=people,{suffix}
objectClass: organizationalUnit
ou: people

dn: ou=groups,{suffix}
objectClass: organizationalUnit
ou: groups

dn: uid=lena,ou=people,{suffix}
objectClass: inetOrgPerson
uid: lena
cn: Lena Berg
givenName: Lena
sn: Berg
mail: lena@directory.example.org
userPassword: {password}

dn: uid=omar,ou=people,{suffix}
objectClass: inetOrgPerson
uid: omar
cn: Omar Haddad
givenName: Omar
sn: Haddad
mail: omar@directory.example.org
userPassword: {password}

dn: cn=gpu-vision,ou=groups,{suffix}
objectClass: groupOfNames
cn: gpu-vision
member: uid=lena,ou=people,{suffix}

dn: cn=lab-nlp,ou=groups,{suffix}
objectClass: groupOfNames
cn: lab-nlp
member: uid=lena,ou=people,{suffix}
member: uid=omar,ou=people,{suffix}

dn: cn=unmapped,ou=groups,{suffix}
objectClass: groupOfNames
cn: unmapped
member: uid=omar,ou=people,{suffix}
"""


@dataclass
class LdapServer:
    """The test directory: its URI, and the portal's environment variables for it."""

    uri: str

    def portal_env(self, **extra: str) -> dict[str, str]:
        return {
            "LDAP_SERVER_URI": self.uri,
            "LDAP_BIND_DN": LDAP_ADMIN_DN,
            "LDAP_BIND_PASSWORD": LDAP_ADMIN_PASSWORD,
            "LDAP_USER_SEARCH_BASE": f"ou=people,{LDAP_SUFFIX}",
            "LDAP_GROUP_SEARCH_BASE": f"ou=groups,{LDAP_SUFFIX}",
        } | extra


@pytest.fixture(scope="session")
def ldap_server(tmp_path_factory):
    """A private slapd (Debian's) on 127.0.0.1 with a small directory, for the session."""
    slapd = shutil.which("slapd") or (os.path.exists("/usr/sbin/slapd") and "/usr/sbin/slapd")
    slapadd = shutil.which("slapadd") or "/usr/sbin/slapadd"
    if not slapd or not os.path.exists(slapadd):
        pytest.skip("slapd is not installed (apt-get install slapd ldap-utils; .ci/run does)")
    folder = tmp_path_factory.mktemp("slapd")
    (folder / "data").mkdir()
    names = {
        "folder": folder,
        "suffix": LDAP_SUFFIX,
        "admin": LDAP_ADMIN_DN,
        "admin_password": LDAP_ADMIN_PASSWORD,
        "password": LDAP_PASSWORD,
    }
    conf = folder / "slapd.conf"
    conf.write_text(_SLAPD_CONF.format(**names))
    (folder / "directory.ldif").write_text(_LDIF.format(**names))
    subprocess.run(
        [slapadd, "-f", str(conf), "-l", str(folder / "directory.ldif")],
        check=True,
        capture_output=True,
    )
    port = free_port()
    # -d keeps slapd in the foreground (so it is our child to stop); 0 logs nothing extra.
    command = [slapd, "-f", str(conf), "-h", f"ldap://127.0.0.1:{port}/", "-d", "0"]
    with open(folder / "slapd.log", "wb") as log:
        process = process_start(command, port=port, env=None, log=log, timeout=30, name="slapd")
    try:
        yield LdapServer(uri=f"ldap://127.0.0.1:{port}")
    finally:
        server_stop(process)
