"""Engine replicas on Ray Serve (``cosmos3-serve --backend ray``), with sessions pinned to a replica and
failover when one is lost. Only the CLI imports the backend; importing this package imports nothing.
"""
