"""Phi-3: declared in issue 29 (being written)."""
