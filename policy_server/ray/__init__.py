"""Engine replicas on Ray Serve (``cosmos3-serve --backend ray``): the backend, the replica deployment and
the router that pins each session to one replica.

Only :mod:`.backend` and :mod:`.replica` import Ray, and only the CLI imports them (for ``--backend
ray``); the router knows nothing of Ray. Importing this package imports nothing.
"""
