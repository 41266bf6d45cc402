"""The HTTP sidecar (FastAPI on uvicorn, its own port): where one-shot action requests and video jobs
enter over HTTP, and where health, metrics and the dashboard's files are answered.

:mod:`.sidecar` runs it; the request bodies are decoded by :mod:`.codecs`, checked against the model by
:mod:`.requests` and answered with :mod:`.schemas` or an :mod:`.errors` answer. Importing this package
imports nothing (a WebSocket-only server never loads FastAPI).
"""
