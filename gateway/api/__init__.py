"""The bodies of turnout's HTTP API as msgspec Structs, and the OpenAPI document built from them.

The handlers of the agents' APIs never decode these: the relay reads raw bytes and checks only what
routing needs (``gateway.requests``), so a request is as fast as it was and engine extensions pass
through untouched. The Structs exist to *describe* the API (``/schema/openapi.json``, assembled in
:mod:`gateway.api.document`) and, for the bodies turnout writes or reads itself (both error shapes,
the admin profile switch), to write and read them, so the schema and the bytes cannot drift.

Request models allow additional properties everywhere a client may send an engine's extension
(``id_slot``, ``cache_prompt``, vLLM's sampling parameters, ...); response models name the fields
every engine sends and allow the rest.
"""
