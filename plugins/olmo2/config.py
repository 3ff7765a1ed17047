"""The OLMo-2 composition; sizes live with the named models (registry.toml)."""

from __future__ import annotations

import dataclasses
from typing import ClassVar, Literal

from ..llama.config import LlamaConfig


@dataclasses.dataclass(frozen=True, kw_only=True)
class Olmo2Config(LlamaConfig):
    """Llama's components in a post-branch block, with q/k RMSNorm over all heads' width."""

    architecture: ClassVar[str] = "olmo2"

    block: str = "post_branch"
    qk_norm: bool = True
    qk_norm_scope: Literal["head", "full"] = "full"
    rope_theta: float = 500000.0
    layer_norm_eps: float = 1e-6
