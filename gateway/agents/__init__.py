"""What coding agents need to know about turnout's models: their configs (``turnout agents``) and
Codex's model catalog on ``GET /v1/models``. Researched per agent version in docs/agents.md."""
