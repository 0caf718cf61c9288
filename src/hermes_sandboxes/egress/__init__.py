"""Egress control for sandboxes: the allow-list, the proxy that enforces it, credential brokering.

Backend-neutral: ``policy`` parses and checks allow-lists (the cloud backends can map the same
entries onto their own egress rules); ``proxy``/``server`` are the proxy the local backend runs per
sandbox; ``broker`` and ``tls`` add credentials to requests without the sandbox ever holding them.
"""
