"""``turnout calibrate``: measuring a running engine into an engine profile (``policies.engine_profile``)."""
