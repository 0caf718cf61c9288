"""The CLI's measured fast path for ``exec``: the warm client (``warm``: built-in modules only), the
per-user fork server that keeps the exec path imported (``server``) and its per-call worker
(``worker``), and the in-process path every first call takes (``inprocess``).

Kept empty: the warm client imports this package, and every import here is paid on each call.
"""
