"""The ``hermes-sandboxes`` command-line tool (entry point ``hermes_sandboxes.cli:main``)."""

from hermes_sandboxes.cli.app import cli, main

__all__ = ["cli", "main"]
