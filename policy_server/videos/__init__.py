"""``forward_dynamics`` video jobs: where they are stored (:mod:`.job_store`, SQLite plus files), what
runs them on the engine (:mod:`.runner`) and how their frames become an MP4 (:mod:`.encoding`).

The HTTP sidecar's ``/v1/videos`` routes create, list and serve jobs; the runner hands each to the
engine worker's background lane and records its result.
"""
