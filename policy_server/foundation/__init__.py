"""The floor every other floor stands on: what any part of the server may use and that uses none of them
(auth, the HTTP API's errors, connection and rate limits, the outbox, bounded JSON text, log hygiene, mapping
files, durable files, the camera frames' one check). Importing it imports nothing."""
