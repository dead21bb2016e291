"""The sign-in settings refuse a half set-up provider at start, naming what is missing."""

import pytest

from portal.env import SettingError
from portal.sso.config import sign_in_settings


def _settings(**env: str) -> dict:
    return sign_in_settings(lambda name, default="": env.get(name, default))


def test_it_has_only_local_passwords_by_default():
    values = _settings()

    assert values["LOCAL_LOGIN_ENABLED"] is True
    assert values["AUTHENTICATION_BACKENDS"] == ["portal.sso.backends.LocalPasswordBackend"]
    assert not values["OIDC_ENABLED"] and not values["LDAP_ENABLED"]


def test_it_takes_blank_variables_as_their_defaults():
    # docker-compose.yml passes unset variables through as empty strings.
    values = _settings(LOCAL_LOGIN_ENABLED="", OIDC_RP_CLIENT_ID=" ", OIDC_PROVIDER_NAME="")

    assert values["LOCAL_LOGIN_ENABLED"] is True and not values["OIDC_ENABLED"]
    assert values["OIDC_PROVIDER_NAME"] == "single sign-on"


def test_it_names_the_missing_oidc_endpoints():
    with pytest.raises(SettingError, match="OIDC_OP_TOKEN_ENDPOINT, OIDC_OP_USER_ENDPOINT"):
        _settings(
            OIDC_RP_CLIENT_ID="portal",
            OIDC_RP_CLIENT_SECRET="s",
            OIDC_OP_AUTHORIZATION_ENDPOINT="https://idp/auth",
            OIDC_OP_JWKS_ENDPOINT="https://idp/jwks",
        )


def test_it_refuses_an_unknown_signing_algorithm():
    with pytest.raises(SettingError, match="OIDC_RP_SIGN_ALGO"):
        _settings(OIDC_RP_CLIENT_ID="portal", OIDC_RP_SIGN_ALGO="none")


def test_it_refuses_to_switch_off_local_login_with_no_other_way_in():
    with pytest.raises(SettingError, match="nobody could sign in"):
        _settings(LOCAL_LOGIN_ENABLED="false")


def test_it_wants_the_ldap_search_bases_and_a_known_group_type():
    with pytest.raises(SettingError, match="LDAP_USER_SEARCH_BASE"):
        _settings(LDAP_SERVER_URI="ldap://127.0.0.1")
    with pytest.raises(SettingError, match="LDAP_GROUP_TYPE"):
        _settings(
            LDAP_SERVER_URI="ldap://127.0.0.1",
            LDAP_USER_SEARCH_BASE="ou=people,dc=x",
            LDAP_GROUP_SEARCH_BASE="ou=groups,dc=x",
            LDAP_GROUP_TYPE="nisNetgroup",
        )


def test_it_wants_the_user_placeholder_in_the_ldap_search_filter():
    with pytest.raises(SettingError, match="LDAP_USER_SEARCH_FILTER"):
        _settings(
            LDAP_SERVER_URI="ldap://127.0.0.1",
            LDAP_USER_SEARCH_BASE="ou=people,dc=x",
            LDAP_GROUP_SEARCH_BASE="ou=groups,dc=x",
            LDAP_USER_SEARCH_FILTER="(uid=everyone)",
        )
