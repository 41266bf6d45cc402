"""``forward_dynamics`` video jobs: stored durably, run on the engine behind the robots' observations, and
encoded as MP4; the HTTP sidecar's ``/v1/videos`` routes create, list and serve them.
"""
