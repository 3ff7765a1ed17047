"""zoo's version and distribution name, importable without the rest of the package."""

__version__ = "0.1.0"

#: The distribution name on the package index (``pip install torch-zoo``); the import name
#: and the command are ``zoo``.
DISTRIBUTION = "torch-zoo"
