"""Egress control for sandboxes: the proxy that enforces an allow-list, credential brokering.

The allow-list's grammar is part of the contract (``hermes_sandboxes.allowlist``: the settings, the
recorder and every backend read it, the cloud backends map its entries onto their own egress rules),
so it lives below this package; ``proxy``/``server`` are the proxy the local backend runs per
sandbox, which records each connection in the audit journal (so this package sits above the
recorder, never below it); ``broker`` and ``tls`` add credentials to requests without the sandbox
ever holding them.
"""
