"""toy-gpt's checkpoint layout: GPT-2's key names (transformers' ``GPT2LMHeadModel``) without
its position embeddings, which toy-gpt does not have."""

from zoo.checkpoint.hf_layout import KeyMap, KeyRule, linear_rules, openai_block_rules

GPT2_KEYS = KeyMap(
    rules=(
        KeyRule("wte.weight", "tok_emb.weight"),
        *openai_block_rules(),  # h.{i}.ln_1, attn.c_attn (stored transposed), ... as GPT-2
        *linear_rules("ln_f", "norm"),
        KeyRule("lm_head.weight", "head.weight"),
    ),
    strip_prefixes=("transformer.",),
    represents={"norm_first": True, "n_kv_heads": None, "bias": True, "qkv_bias": None},
)
