"""SGLang's Cosmos3 action API, translated onto ours: pure functions, no I/O.

SGLang's ``multimodal_gen`` server is where Cosmos3 policy serving started, and its clients speak a
request envelope of their own (``{"request_id", "input": {"task", "observation"}, "parameters",
"runtime"}``), SGLang's parameter names (``num_inference_steps``, ``action_view_point``, ``domain_id``
+ ``raw_action_dim``, ...), its reply envelope (``object: "action.generation"``) and a lock-step
WebSocket mode. This package turns all of that into the fields our own API already checks, and our
results back into SGLang's answers, so the HTTP routes and the WebSocket server only have to call it:

* :mod:`.parameters`: SGLang's parameter names and values onto ours (domains by id, sizes to tiers,
  normalization names, ``extra_params``), shared by the two endpoints;
* :mod:`.media`: SGLang's image and video value forms (``{"b64_json"}``, ``{"values", "dtype",
  "shape"}``, nested lists, arrays, batches) to the forms our codecs decode;
* :mod:`.actions`: the ``/v1/actions/generations`` envelope in, one request per batch item and
  candidate out (:mod:`.action_form`: SGLang's multipart form as that envelope); :mod:`.action_reply`:
  SGLang's reply envelope (``envelope`` or ``raw``, ``list`` or ``numpy``) back;
* :mod:`.videos`: SGLang's ``/v1/videos`` field names onto ours;
* :mod:`.metadata`: SGLang's ``/v1/actions/metadata`` keys from the typed model
  description (``cosmos3_runtime.description``);
* :mod:`.realtime`: the lock-step WebSocket mode (first frame without ``type``) as a sans-I/O session.

Where SGLang is unsafe (server file paths and URLs, tracebacks to the client, closing on error,
averaging candidate trajectories) we refuse with our typed errors instead; ``docs/sglang.md`` lists
every difference and why.
"""
