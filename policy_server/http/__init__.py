"""The HTTP sidecar (FastAPI on uvicorn, its own port): where one-shot action requests and video jobs
enter over HTTP, and where health, metrics and the dashboard's files are answered.

:mod:`.sidecar` runs it (:mod:`.serving`: uvicorn); :mod:`.app` builds the application from one router
per resource (:mod:`.routes`). Request bodies are read by :mod:`.bodies`, decoded by :mod:`.codecs` and
:mod:`.media_fields`, checked against the model by :mod:`.requests` and answered with :mod:`.schemas` or
an :mod:`.errors` answer. The sidecar sees the server only through :mod:`.host`. Importing this package
imports nothing (a WebSocket-only server never loads FastAPI).
"""
