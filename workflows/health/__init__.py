"""``/readyz``: the absence monitors (``workflows.engine.health``) over HTTP, for probes."""
