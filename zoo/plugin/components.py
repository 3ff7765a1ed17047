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
    """Positions, norms, feed-forwards, attention and blocks that come with zoo."""
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
            "RoPE on queries and keys (rotate-half, rope_theta, rotary_dim, rope_local_theta)",
            reads=("rope_theta", "rotary_dim", "rope_local_theta"),
        ),
        ComponentSpec(
            "positions", "none", f"{nn}.positions:none", "no position information", reads=()
        ),
        ComponentSpec(
            "norm",
            "layernorm",
            f"{nn}.norms:layernorm",
            "LayerNorm (layer_norm_eps, norm_bias)",
            reads=("layer_norm_eps", "norm_bias"),
        ),
        ComponentSpec(
            "norm",
            "rmsnorm",
            f"{nn}.norms:rmsnorm",
            "RMSNorm (layer_norm_eps)",
            reads=("layer_norm_eps",),
        ),
        ComponentSpec(
            "norm",
            "rmsnorm1p",
            f"{nn}.norms:rmsnorm1p",
            "RMSNorm scaled by 1 + weight, in float32 (Gemma; layer_norm_eps)",
            reads=("layer_norm_eps",),
        ),
        ComponentSpec(
            "ffn",
            "mlp",
            f"{nn}.feedforward:mlp",
            "proj(act(fc(x))), act = activation (gelu, gelu_tanh, relu, silu)",
            reads=("activation", "mlp_bias"),
        ),
        ComponentSpec(
            "ffn",
            "swiglu",
            f"{nn}.feedforward:swiglu",
            "proj(silu(gate) * up)",
            reads=("mlp_bias",),
        ),
        ComponentSpec(
            "ffn",
            "geglu",
            f"{nn}.feedforward:geglu",
            "proj(gelu(gate) * up)",
            reads=("activation", "mlp_bias"),
        ),
        ComponentSpec(
            "attention",
            "mha",
            f"{nn}.attention:mha",
            "scaled dot-product attention; grouped-query with n_kv_heads, optional biases, "
            "attn_scale, attn_softcap",
        ),
        ComponentSpec(
            "cross_attention",
            "mha",
            f"{nn}.attention:cross_mha",
            "attention over the encoder's output (n_kv_heads, biases)",
            reads=(),
        ),
        ComponentSpec(
            "block",
            "transformer",
            f"{nn}.blocks:transformer",
            "x + f(norm(x)) (pre-LN), norm(x + f(x)) (post-LN) or x + attn(norm1(x)) + "
            "ffn(norm2(x)) (parallel_residual)",
            reads=("norm_first", "parallel_residual"),
        ),
        ComponentSpec(
            "block",
            "sandwich",
            f"{nn}.blocks:sandwich",
            "x + post_norm(f(pre_norm(x))): four norms per block (Gemma 2, Gemma 3)",
            reads=(),
        ),
        ComponentSpec(
            "block",
            "post_branch",
            f"{nn}.blocks:post_branch",
            "x + norm(f(x)): each branch normed inside the residual (OLMo-2)",
            reads=(),
        ),
        ComponentSpec(
            "block",
            "parallel_shared",
            f"{nn}.blocks:parallel_shared",
            "x + attn(norm(x)) + ffn(norm(x)): one norm for both branches (GPT-J, Cohere)",
            reads=(),
        ),
    ]
