"""The HTTP sidecar (FastAPI on uvicorn, its own port): where one-shot action requests and video jobs
enter over HTTP, and where health, metrics and the dashboard's files are answered.

Importing this package imports nothing, so a WebSocket-only server never loads FastAPI.
"""
