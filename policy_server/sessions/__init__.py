"""Where a request enters and where its answer leaves: one session per WebSocket connection.

A robot's connection is a native (:mod:`.native`) or an openpi (:mod:`.openpi`) session; the dashboard's is
an observer (:mod:`.observer`). Each turns frames into observations for the engine's queue and its outcomes
back into frames, through the bounded outbox every connection has (:mod:`policy_server.foundation.outbox`,
watched by :mod:`policy_server.foundation.connection_supervisor`). Operator controls (:mod:`.controls`) live
here too; a session's settings are :mod:`policy_server.session_config`'s, shared with the sidecar and the
features. The rules a session keeps about its observations (order, one terminal reply, latest wins) are
sans-I/O (:mod:`.observation_rules`); the features that care about a session hear of it as listeners
(:mod:`policy_server.session_events`; the telemetry observers read, :mod:`.telemetry`, is the one built in), a
feature's own paths on the port are :mod:`.endpoints`, and other protocols on the robots' path are dialects
chosen by a connection's first frame (:class:`.native.Dialect`).
"""
