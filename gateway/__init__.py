"""The turnout service: HTTP API, relay, settings, CLI. ``create_app(settings)`` is its composition root."""
