"""API token configuration: digests mapped to callers, parsed strictly, matched by bearer token."""

from __future__ import annotations

from pathlib import Path

import pytest

from controlplane.api.auth import OPEN_CALLER, Authenticator, hash_token, new_token, parse_entries
from controlplane.bootstrap import Settings
from controlplane.service.access import Caller, Role, list_scope
from vidroute_core.exceptions import PermissionDenied


def test_entries_map_digests_to_tenants_and_admins() -> None:
    """Commas, newlines and comments all separate entries; roles and tenants are kept."""
    t, a = new_token(), new_token()
    entries = parse_entries(
        [f"{hash_token(t)}=tenant:acme  # acme's CI", f" {hash_token(a)}=admin,"]
    )
    assert entries[hash_token(t)].tenant_id == "acme"
    assert entries[hash_token(t)].role is Role.TENANT
    assert entries[hash_token(a)].is_admin


@pytest.mark.parametrize(
    "line",
    [
        "abc=admin",  # not a digest
        f"{'g' * 64}=admin",
        f"{'a' * 64}",  # no grant
        f"{'a' * 64}=tenant:",  # tenant without id
        f"{'a' * 64}=root",
        f"{'a' * 64}=admin:acme",
        f"{'a' * 64}=admin,{'a' * 64}=tenant:x",  # the same digest twice
    ],
)
def test_malformed_entries_are_refused(line: str) -> None:
    """A typo in the token list stops start-up instead of silently locking someone out (or in)."""
    with pytest.raises(ValueError, match="auth entry"):
        parse_entries([line])


def test_bearer_tokens_are_matched_by_their_digest() -> None:
    """Only `authorization: Bearer <token>` with a configured token identifies a caller."""
    token = new_token()
    auth = Authenticator(parse_entries([f"{hash_token(token)}=tenant:acme"]))
    assert auth.authenticate([("authorization", f"Bearer {token}")]) == Caller.tenant(
        "acme", f"tenant:acme:{hash_token(token)[:8]}"
    )
    assert auth.authenticate([("authorization", f"bearer {token}")]) is not None
    for metadata in ([], [("authorization", token)], [("authorization", f"Bearer {token}x")]):
        assert auth.authenticate(metadata) is None
    assert Authenticator().authenticate([]) is OPEN_CALLER  # no tokens: the open mode


def test_settings_read_tokens_from_env_and_file(tmp_path: Path) -> None:
    """VIDROUTE_AUTH_TOKENS and VIDROUTE_AUTH_FILE add up; `required` without any refuses."""
    t1, t2 = new_token(), new_token()
    path = tmp_path / "tokens"
    path.write_text(f"# ops\n{hash_token(t2)}=admin\n")
    settings = Settings.from_env(
        {"VIDROUTE_AUTH_TOKENS": f"{hash_token(t1)}=tenant:acme", "VIDROUTE_AUTH_FILE": str(path)}
    )
    assert set(settings.auth_tokens) == {hash_token(t1), hash_token(t2)}
    assert Settings.from_env({}).auth_tokens == {}
    assert (
        Settings.from_env({"VIDROUTE_AUTH": "off", "VIDROUTE_AUTH_TOKENS": "junk"}).auth_tokens
        == {}
    )
    with pytest.raises(ValueError, match="required"):
        Settings.from_env({"VIDROUTE_AUTH": "required"})
    with pytest.raises(ValueError, match=r"VIDROUTE_AUTH=.maybe.: Input should be"):
        Settings.from_env({"VIDROUTE_AUTH": "maybe"})


def test_list_scope_pins_tenants_to_their_own() -> None:
    """Empty tenant: the caller's own (admin: all); naming another tenant is refused."""
    acme = Caller.tenant("acme")
    assert list_scope(acme, None) == "acme"
    assert list_scope(acme, "acme") == "acme"
    with pytest.raises(PermissionDenied):
        list_scope(acme, "globex")
    assert list_scope(Caller.admin(), None) is None
    assert list_scope(Caller.admin(), "globex") == "globex"
