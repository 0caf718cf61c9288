"""``python -m hermes_sandboxes.cli``: the same as the ``hermes-sandboxes`` console script."""

from hermes_sandboxes.cli import main

main()
