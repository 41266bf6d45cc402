"""SGLang's Cosmos3 action API, translated onto ours: pure functions, no I/O.

SGLang's ``multimodal_gen`` server is where Cosmos3 policy serving started, and its clients speak a
request envelope of their own (``{"request_id", "input": {"task", "observation"}, "parameters",
"runtime"}``), SGLang's parameter names (``num_inference_steps``, ``action_view_point``, ``domain_id``
+ ``raw_action_dim``, ...), its reply envelope (``object: "action.generation"``) and a lock-step
WebSocket mode. This package turns all of that into the fields our own API already checks, and our
results back into SGLang's answers, so the HTTP routes and the WebSocket server only have to call it.

Where SGLang is unsafe (server file paths and URLs, tracebacks to the client, closing on error,
averaging candidate trajectories) we refuse with our typed errors instead; ``docs/sglang.md`` lists
every difference and why.
"""
