"""turnout as the Endpoint Picker (EPP) of the Gateway API Inference Extension: Envoy (or any
conformant gateway) carries the bytes, and asks turnout over ext_proc which engine each request goes
to (``turnout epp``; docs/epp.md).

- ``wire``: the EPP protocol's names and Envoy's messages (pure);
- ``exchange``: one request's ext_proc stream, on the same core and lifecycle as ``turnout serve``;
- ``server``: the gRPC server, its health services, and the process around them.
"""
