"""OLMo-2: declared in issue 29 (being written)."""
