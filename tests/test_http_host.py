"""The server's narrow face (:class:`policy_server.sessions.host.SessionHost`), which sessions, the sidecar
and the backends see, is one the server has.

No type checker runs in CI, so this checks the protocol against ``PolicyServer`` and ``ServerSettings``
in process: every attribute, property and method the sidecar reads exists there.
"""

from __future__ import annotations

from policy_server.server import PolicyServer, ServerSettings
from policy_server.sessions.host import HostSettings, SessionHost


def _members(protocol: type) -> set[str]:
    declared = set(getattr(protocol, "__annotations__", {}))
    declared |= {
        name
        for name, value in vars(protocol).items()
        if not name.startswith("_") and (callable(value) or isinstance(value, property))
    }
    return declared


def test_the_server_settings_have_every_field_the_sidecar_reads():
    settings = ServerSettings()
    assert {name for name in _members(HostSettings) if not hasattr(settings, name)} == set()


def test_the_server_has_every_member_of_the_session_host():
    server = PolicyServer(lambda: None)
    missing = {name for name in _members(SessionHost) if name not in vars(server) and not hasattr(PolicyServer, name)}
    assert missing == set()
