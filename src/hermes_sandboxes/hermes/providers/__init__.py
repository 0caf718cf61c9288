"""Our Hermes terminal-backend providers: what they share (``base``), which this process registered
(``registry``), and one module per backend (``local``, ``sprites``, ``e2b``) that only declares.
"""
