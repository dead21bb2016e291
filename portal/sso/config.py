"""Sign-in settings from the environment: which ways to sign in are on, and how each is set up.

Read once by portal/settings.py. OpenID Connect is on when OIDC_RP_CLIENT_ID is set, LDAP when
LDAP_SERVER_URI is set; ldap3 is imported only then, so a site without LDAP needs it not
installed.
"""

from collections.abc import Callable

from portal.env import SettingError, parse_bool

Env = Callable[..., str]

LOCAL_BACKEND = "portal.sso.backends.LocalPasswordBackend"
OIDC_BACKEND = "portal.sso.backends.PortalOIDCBackend"
LDAP_BACKEND = "portal.sso.ldap_backend.PortalLDAPBackend"
OIDC_ENDPOINTS = (
    "OIDC_OP_AUTHORIZATION_ENDPOINT",
    "OIDC_OP_TOKEN_ENDPOINT",
    "OIDC_OP_USER_ENDPOINT",
)
OIDC_SIGN_ALGOS = ("RS256", "RS384", "RS512", "ES256", "ES384", "ES512", "HS256", "HS384", "HS512")
LDAP_GROUP_TYPES = ("groupOfNames", "groupOfUniqueNames", "posixGroup")


def _bool(env: Env, name: str, default: bool) -> bool:
    """$NAME as a boolean (1/0, true/false, yes/no, on/off); blank means the default."""
    return parse_bool(name, env(name, ""), default)


def _read(env: Env, name: str, default: str = "") -> str:
    """$NAME stripped; unset or blank (a compose file's `${NAME:-}`) means the default."""
    return env(name, "").strip() or default


def sign_in_settings(env: Env) -> dict:
    """Django settings for signing in; `env(name, default)` reads one variable."""
    local = _bool(env, "LOCAL_LOGIN_ENABLED", True)
    values = {"LOCAL_LOGIN_ENABLED": local, "AUTHENTICATION_BACKENDS": [LOCAL_BACKEND]}
    values |= oidc_settings(env)
    values |= ldap_settings(env)
    if values["OIDC_ENABLED"]:
        values["AUTHENTICATION_BACKENDS"].append(OIDC_BACKEND)
    if values["LDAP_ENABLED"]:
        values["AUTHENTICATION_BACKENDS"].append(LDAP_BACKEND)
    if not (local or values["OIDC_ENABLED"] or values["LDAP_ENABLED"]):
        raise SettingError(
            "LOCAL_LOGIN_ENABLED is off but neither OpenID Connect (OIDC_RP_CLIENT_ID) nor "
            "LDAP (LDAP_SERVER_URI) is set up: nobody could sign in."
        )
    return values


def oidc_settings(env: Env) -> dict:
    """mozilla-django-oidc's settings, plus the portal's own OIDC_* knobs."""
    client_id = _read(env, "OIDC_RP_CLIENT_ID", "")
    values: dict = {
        "OIDC_ENABLED": bool(client_id),
        "OIDC_PROVIDER_NAME": _read(env, "OIDC_PROVIDER_NAME", "single sign-on"),
        # Where a failed or cancelled sign-in at the provider comes back to.
        "LOGIN_REDIRECT_URL_FAILURE": "/accounts/login/?sso=failed",
    }
    if not client_id:
        return values
    missing = [name for name in OIDC_ENDPOINTS if not _read(env, name)]
    algo = _read(env, "OIDC_RP_SIGN_ALGO", "RS256")
    if algo not in OIDC_SIGN_ALGOS:
        raise SettingError(
            f"OIDC_RP_SIGN_ALGO={algo!r}: expected one of {', '.join(OIDC_SIGN_ALGOS)}"
        )
    if not algo.startswith("HS") and not _read(env, "OIDC_OP_JWKS_ENDPOINT", ""):
        missing.append("OIDC_OP_JWKS_ENDPOINT")
    secret = env("OIDC_RP_CLIENT_SECRET", "")
    if not secret:
        missing.append("OIDC_RP_CLIENT_SECRET")
    if missing:
        raise SettingError(f"OIDC_RP_CLIENT_ID is set, so set {', '.join(missing)} too.")
    groups_claim = _read(env, "OIDC_GROUPS_CLAIM", "groups")
    username_claim = _read(env, "OIDC_USERNAME_CLAIM", "preferred_username")
    values |= {
        "OIDC_RP_CLIENT_ID": client_id,
        "OIDC_RP_CLIENT_SECRET": secret,
        "OIDC_RP_SIGN_ALGO": algo,
        "OIDC_RP_SCOPES": _read(env, "OIDC_RP_SCOPES", "openid email profile"),
        "OIDC_OP_JWKS_ENDPOINT": _read(env, "OIDC_OP_JWKS_ENDPOINT", "") or None,
        "OIDC_GROUPS_CLAIM": groups_claim,
        "OIDC_USERNAME_CLAIM": username_claim,
        "OIDC_CREATE_USER": _bool(env, "OIDC_CREATE_USER", True),
        "OIDC_VERIFY_SSL": _bool(env, "OIDC_VERIFY_SSL", True),
        "OIDC_TIMEOUT": 10,
    }
    values |= {name: _read(env, name) for name in OIDC_ENDPOINTS}
    return values


def ldap_settings(env: Env) -> dict:
    """The LDAP_* settings portal.sso.ldap_backend reads, checked."""
    uri = _read(env, "LDAP_SERVER_URI", "")
    if not uri:
        return {"LDAP_ENABLED": False}
    user_base = _read(env, "LDAP_USER_SEARCH_BASE", "")
    group_base = _read(env, "LDAP_GROUP_SEARCH_BASE", "")
    group_type = _read(env, "LDAP_GROUP_TYPE", "groupOfNames")
    if not user_base or not group_base:
        raise SettingError(
            "LDAP_SERVER_URI is set, so set LDAP_USER_SEARCH_BASE and LDAP_GROUP_SEARCH_BASE too."
        )
    if group_type not in LDAP_GROUP_TYPES:
        raise SettingError(
            f"LDAP_GROUP_TYPE={group_type!r}: expected one of {', '.join(LDAP_GROUP_TYPES)}"
        )
    try:
        import ldap3  # noqa: F401
    except ImportError:
        raise SettingError(
            "LDAP_SERVER_URI is set but ldap3 is not installed: pip install 'gpu-portal[ldap]'."
        ) from None
    user_filter = _read(env, "LDAP_USER_SEARCH_FILTER", "(uid=%(user)s)")
    if "%(user)s" not in user_filter:
        raise SettingError(
            f"LDAP_USER_SEARCH_FILTER={user_filter!r}: expected a filter with %(user)s in it"
        )
    return {
        "LDAP_ENABLED": True,
        "LDAP_SERVER_URI": uri,
        "LDAP_BIND_DN": _read(env, "LDAP_BIND_DN", ""),
        "LDAP_BIND_PASSWORD": env("LDAP_BIND_PASSWORD", ""),
        "LDAP_START_TLS": _bool(env, "LDAP_START_TLS", False),
        "LDAP_USER_SEARCH_BASE": user_base,
        "LDAP_USER_SEARCH_FILTER": user_filter,
        "LDAP_GROUP_SEARCH_BASE": group_base,
        "LDAP_GROUP_TYPE": group_type,
        "LDAP_TIMEOUT_S": 10,
    }
