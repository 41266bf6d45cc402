"""Where a request enters and where its answer leaves: one session per WebSocket connection.

A robot's connection is a native (:mod:`.native`) or an openpi (:mod:`.openpi`)
session; the dashboard's is an observer (:mod:`.observer`). Each turns frames into observations for the
engine's queue and its outcomes back into frames, through a bounded outbox (:mod:`.outbox`) that the
supervisor (:mod:`.supervisor`) watches. Settings (:mod:`.config`) and operator controls (:mod:`.controls`)
live here too. The rules a session keeps about its observations (order, rate, one terminal reply, latest
wins) are sans-I/O (:mod:`.observation_rules`); the features that care about a session hear of it as
listeners (:mod:`.listener`, where the telemetry observers read is the one built in), and other protocols
on the robots' path are dialects chosen by a connection's first frame (:class:`.native.Dialect`).
"""
