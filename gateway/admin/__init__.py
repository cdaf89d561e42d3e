"""The admin dashboard: the ``/admin`` pages (``views``) and the ``/admin/api/`` JSON (``api_views``),
what the two share (``responses``), who may use them (``auth``), what the pages show
(``reads``: ``AdminReads``) and the actions they take (``service``: ``AdminService``). See
docs/dashboard.md."""
