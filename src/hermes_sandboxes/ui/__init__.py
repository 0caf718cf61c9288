"""Text for people and scripts, shared by every face that prints: the ``hermes-sandboxes`` CLI and
``hermes sandbox`` (Hermes's CLI), which must print the same things the same way.

Below the faces (``cli``, ``hermes``, ``mcp``) and above the recorder: a face may import it, it
imports no face, so the faces share their output without importing each other.
"""
