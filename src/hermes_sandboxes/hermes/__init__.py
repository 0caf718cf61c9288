"""The Hermes Agent plugin: a terminal backend over the backend-neutral contract, plus agent tools.

Every module that imports Hermes does so lazily or through ``host``, so ``import hermes_sandboxes``
never needs Hermes installed. The plugin ids registered through pip entry points are listed in
``PLUGIN_IDS``; the cloud backends add theirs (``sprites``, ``e2b``) with their own provider class.
"""

PLUGIN_IDS = ("sandbox", "sprites", "e2b")
