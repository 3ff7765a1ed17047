"""Models zoo trains and ships: ``shakespeare-byte``, a small GPT-2-style decoder trained by
``zoo train`` on Tiny Shakespeare (public domain, vendored in ``data/``) with the byte
tokenizer. Its weights ship inside the package, so it generates offline.

This module only declares specs.
"""

from __future__ import annotations

from zoo.plugin.hookspecs import hookimpl
from zoo.plugin.specs import TokenizerSpec


@hookimpl
def zoo_tokenizers() -> list[TokenizerSpec]:
    return [
        TokenizerSpec(
            name="byte",
            factory="zoo.tokenizers.byte:load",
            description="UTF-8 bytes (256 ids) + <|endoftext|>, no data files",
        )
    ]
