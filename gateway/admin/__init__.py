"""The admin dashboard: ``/admin`` pages and ``/admin/api/`` JSON (``views``), who may use them
(``auth``), and what they show and change (``service``). See docs/dashboard.md."""
