"""``forge serve``: a Tinker-compatible training and sampling server (``forge.serve.server``).

Modules: ``serve_config`` (``ServeConfig``), ``app`` (the HTTP routes), ``state`` (training
clients, sampling sessions), ``checkpoints`` (checkpoints on disk, and sampling from them),
``futures`` (queued work and its results), ``wire`` (protobuf bodies), ``parse`` (request
bodies)."""
