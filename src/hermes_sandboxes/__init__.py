"""hermes-sandboxes: sandboxes for an AI agent's shell commands.

Kept import-light on purpose: the local sandbox's init process imports this package and its memory
footprint counts against every idle sandbox.
"""

__version__ = "0.1.0"
