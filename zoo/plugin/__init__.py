"""The plugin contract: the hooks (``hookspecs``), the specs plugins return (``specs``,
``model_specs``, ``tokenizer_specs``), a Hugging Face family declared in one call
(``family``), the built-in components, plugin discovery (``host``), the registry object that
resolves names against them (``registry``) and the registry in use (``current``)."""
