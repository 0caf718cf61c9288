"""Helpers with no domain knowledge: light value classes, lazy imports, units, bounded capture.

Nothing in ``util`` imports another part of the package, so every other package may import it.
"""
