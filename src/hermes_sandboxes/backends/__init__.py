"""Backends: one module (or package) per place a sandbox can live."""
