"""``forge serve``: a Tinker-compatible training and sampling server (``forge.serve.server``).

Modules: ``config`` (``ServeConfig``), ``app`` (the HTTP routes), ``state`` (training clients,
sampling sessions), ``futures`` (queued work and its results), ``wire`` (protobuf bodies)."""
