"""zoo-toy: a third-party zoo plugin (the one in docs/plugins.md)."""

from zoo import ArchitectureSpec, ModelSpec, hookimpl
from zoo.plugin.specs import ComponentSpec


@hookimpl
def zoo_architectures():
    return [
        ArchitectureSpec(
            name="toy-gpt",
            config="zoo_toy.model:ToyConfig",  # lazy "module:attr": no torch import here
            model="zoo_toy.model:ToyGPT",
            description="byte-level pre-LN GPT without position embeddings (NoPE)",
            blocks=("pre-LN decoder block",),
            checkpoint_layouts={"gpt2-keys": "zoo_toy.layout:GPT2_KEYS"},
            reference="zoo_toy.reference:load",  # what the conformance kit compares with
        )
    ]


@hookimpl
def zoo_models():
    return [
        ModelSpec(
            name="toy-gpt-tiny",
            architecture="toy-gpt",
            config={"d_model": 64, "n_heads": 4, "n_layers": 2},
            description="a 100k-parameter byte-level toy",
        ),
        ModelSpec(  # zoo's own decoder, with this plugin's position scheme
            name="toy-alibi",
            architecture="gpt2",
            tokenizer="byte",
            config={
                "vocab_size": 257,
                "context_length": 64,
                "d_model": 32,
                "n_heads": 4,
                "n_layers": 2,
                "d_ff": 64,
                "positions": "alibi",
            },
            description="a small GPT-2-layout decoder with ALiBi positions",
        ),
    ]


@hookimpl
def zoo_components():
    return [ComponentSpec("positions", "alibi", "zoo_toy.alibi:alibi", "ALiBi score bias")]
