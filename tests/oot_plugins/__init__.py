"""Out-of-tree families, written as a third-party plugin author writes them from
docs/plugins.md and docs/families.md: declarations (a config deriving from
``zoo.config.DecoderConfig`` with other defaults, the hooks) and a Hugging Face layout, with
no model code and no subclass of ``zoo.nn.DecoderLM``. ``tests/test_oot_families.py``
registers them (``zoo.plugin.current.load_registry(plugins=...)`` + ``zoo.use_registry``) and holds
each against transformers' own class.

- :mod:`oot_plugins.gptj`: GPT-J (one norm shared by parallel attention and MLP, partial
  rotary as a count, rotary pairs interleaved, a biased untied head).
- :mod:`oot_plugins.cohere`: Cohere Command-R (the same block, a bias-free mean-centred
  LayerNorm, SwiGLU, a logit scale, interleaved rotary, tied head).
- :mod:`oot_plugins.starcoder2`: StarCoder2 (linears without biases beside LayerNorms with
  them, a tanh-GELU MLP, grouped-query attention, a sliding window).
"""
