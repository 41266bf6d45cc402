"""Engine replicas on Ray Serve (``cosmos3-serve --backend ray``): the backend (replicas' lifecycle and
failover), their deployment on Serve, the remote engine each replica's worker calls, the replica itself,
and the router that pins each session to one replica.

Only :mod:`.deployment`, :mod:`.remote_engine` and :mod:`.replica` import Ray (:mod:`.backend` imports
them), and only the CLI imports the backend (for ``--backend ray``); the router knows nothing of Ray.
Importing this package imports nothing.
"""
