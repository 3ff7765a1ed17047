"""The built-in components, registered as plugin ``zoo`` through the same hook
(``zoo_components``) third-party plugins use, so conflicts, ``ZOO_PREFER``, strict mode and
``zoo plugins`` treat them alike. Implementations are named lazily: this module imports no
torch.
"""

from __future__ import annotations

from .hookspecs import hookimpl
from .specs import ComponentSpec

__all__ = ["zoo_components"]


@hookimpl
def zoo_components() -> list[ComponentSpec]:
    """Positions, norms, feed-forwards and attention that come with zoo."""
    nn = "zoo.nn"
    return [
        ComponentSpec(
            "positions",
            "learned",
            f"{nn}.positions:learned",
            "one trained vector per position",
            reads=(),
        ),
        ComponentSpec(
            "positions",
            "sinusoidal",
            f"{nn}.positions:sinusoidal",
            "fixed sin/cos vectors",
            reads=(),
        ),
        ComponentSpec(
            "positions",
            "rotary",
            f"{nn}.positions:rotary",
            "RoPE on queries and keys (rotate-half, rope_theta, rotary_fraction)",
            reads=("rope_theta", "rotary_fraction"),
        ),
        ComponentSpec(
            "positions", "none", f"{nn}.positions:none", "no position information", reads=()
        ),
        ComponentSpec(
            "norm",
            "layernorm",
            f"{nn}.norms:layernorm",
            "LayerNorm (layer_norm_eps)",
            reads=("layer_norm_eps",),
        ),
        ComponentSpec(
            "norm",
            "rmsnorm",
            f"{nn}.norms:rmsnorm",
            "RMSNorm (layer_norm_eps)",
            reads=("layer_norm_eps",),
        ),
        ComponentSpec(
            "ffn",
            "mlp",
            f"{nn}.feedforward:mlp",
            "proj(act(fc(x))), act = activation (gelu, gelu_tanh, relu, silu)",
            reads=("activation",),
        ),
        ComponentSpec(
            "ffn", "swiglu", f"{nn}.feedforward:swiglu", "proj(silu(gate) * up)", reads=()
        ),
        ComponentSpec(
            "ffn",
            "geglu",
            f"{nn}.feedforward:geglu",
            "proj(gelu(gate) * up)",
            reads=("activation",),
        ),
        ComponentSpec(
            "attention",
            "mha",
            f"{nn}.attention:mha",
            "scaled dot-product attention; grouped-query with n_kv_heads, optional biases",
        ),
        ComponentSpec(
            "cross_attention",
            "mha",
            f"{nn}.attention:cross_mha",
            "attention over the encoder's output (n_kv_heads, biases)",
            reads=(),
        ),
    ]
