"""Copy-on-write storage of local sandboxes: the stores (``base``: the btrfs and copy stores behind one
interface), the tree walks that never leave a tree a sandbox may be changing (``fdwalk``), what changed
between layers (``treediff``, and ``btrfstree`` from btrfs metadata), per-sandbox disk quotas
(``quota``) and store upkeep (``maintenance``: migrate, reclaim, unmount).
"""
