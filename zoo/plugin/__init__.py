"""The plugin contract: hook specifications, the specs plugins return, the built-in components,
plugin discovery and the registry that resolves names against them."""
