"""The mBART composition; the defaults are ``facebook/mbart-large-cc25``'s sizes."""

from __future__ import annotations

import dataclasses
from typing import ClassVar

from ..bart.config import BartConfig


@dataclasses.dataclass(frozen=True, kw_only=True)
class MBartConfig(BartConfig):
    """BART's composition made pre-LN, with a norm after each stack; token embeddings scaled
    by ``sqrt(d_model)``."""

    architecture: ClassVar[str] = "mbart"

    vocab_size: int = 250027
    norm_first: bool = True
    final_norm: bool = True
    scale_embeddings: bool = True
