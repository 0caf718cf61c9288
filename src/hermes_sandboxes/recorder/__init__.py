"""The recorder: what makes a sandbox journaled, the part of this project no other sandbox has.

Every face (CLI, Python API, Hermes plugin, MCP server) runs its commands through
``recorder.sandbox.RecordedSandbox``, which wraps any backend's ``Sandbox`` and keeps, per sandbox, a
journal on the host: each command written ahead before it starts (``writeahead``), its end recorded
however it ends (``command``), checkpoints with the story of what ran and what changed since
(``story``, ``diffsummary``), lost commands of dead recorders settled by the next call (``lost``,
``liveness``), and per-command credentials that exist for one command only (``credentials``).
``records`` holds the record types, ``journal`` their files, ``state`` the host directory that owns
every file kept beside a journal.

The recorder knows no face: faces pass hooks in. Nothing here imports ``cli``, ``hermes`` or ``mcp``.
"""
