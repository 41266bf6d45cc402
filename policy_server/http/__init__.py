"""The HTTP sidecar (FastAPI on uvicorn, its own port): where one-shot action requests and video jobs
enter over HTTP, and where health, metrics and the dashboard's files are answered.

:mod:`.sidecar` assembles and runs it (the app from one router per resource, :mod:`.routes`; uvicorn).
Request bodies are read by :mod:`.bodies`, decoded by :mod:`.codecs`, checked
against the model by :mod:`.requests` and answered with :mod:`.schemas` or an :mod:`.errors` answer;
the routes share :mod:`.context`.
Importing this package imports nothing (a WebSocket-only server never loads FastAPI).
"""
