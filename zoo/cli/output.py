"""What the ``zoo`` commands print: text from plugins and registry files made safe for a
terminal, and aligned tables."""

from __future__ import annotations

from collections.abc import Sequence

__all__ = ["printable", "table"]

#: Unicode categories never printed raw: controls (terminal escape sequences start with ESC),
#: format characters (bidirectional overrides), surrogates, private-use and unassigned code
#: points, line and paragraph separators.
_UNPRINTABLE = frozenset({"Cc", "Cf", "Cs", "Co", "Cn", "Zl", "Zp"})


def printable(text: object) -> str:
    """``text`` as one line a terminal shows as written: every control or format character
    (``ESC`` of a terminal escape code, a newline, a bidirectional override) is spelled as an
    escape (``\\x1b``). Everything a plugin or registry file supplies is printed through this."""
    import unicodedata

    return "".join(
        (
            f"\\x{ord(c):02x}"
            if ord(c) < 0x100
            else f"\\u{ord(c):04x}"
            if ord(c) < 0x10000
            else f"\\U{ord(c):08x}"
        )
        if unicodedata.category(c) in _UNPRINTABLE
        else c
        for c in str(text)
    )


def table(rows: Sequence[Sequence[str]], header: Sequence[str]) -> str:
    """``rows`` under ``header`` in aligned columns, a dashed line below the header."""
    rows = [[printable(c) for c in row] for row in rows]
    widths = [max(len(str(r[i])) for r in [header, *rows]) for i in range(len(header))]
    lines = [
        "  ".join(str(c).ljust(w) for c, w in zip(row, widths, strict=True)).rstrip()
        for row in [header, *rows]
    ]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)
