"""zoo's built-in plugins (installed as ``zoo_plugins``), loaded through the ``zoo`` entry-point
group exactly like third-party plugins."""
