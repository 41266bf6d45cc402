"""Where a request enters and where its answer leaves: one session per WebSocket connection.

A robot's connection is a native (:mod:`.native`) or an openpi (:mod:`.openpi`)
session; the dashboard's is an observer (:mod:`.observer`). Each turns frames into observations for the
engine's queue and its outcomes back into frames, through a bounded outbox (:mod:`.outbox`) that the
supervisor (:mod:`.supervisor`) watches. Settings (:mod:`.config`), operator controls (:mod:`.controls`),
telemetry for observers (:mod:`.telemetry`) and per-session rate limits (:mod:`.rate_limits`) live here
too.
"""
