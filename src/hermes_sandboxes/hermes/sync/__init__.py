"""Keeping a Hermes profile's files and a sandbox in step: file sync over Hermes's own manager
(``filesync``), which process may write (``leases``), taking files back on resume (``recovery``) from
untrusted archives (``archive``) by safe host writes (``hostwrite``), and when cleanup may run
(``teardown``).

Hermes-only: the recorder and the backends never import this package.
"""
