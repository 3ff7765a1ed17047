"""zoo-toy: a third-party zoo plugin (the one in the README's "Writing a plugin")."""

from zoo import ArchitectureSpec, ModelSpec, hookimpl


@hookimpl
def zoo_architectures():
    return [
        ArchitectureSpec(
            name="toy-gpt",
            config="zoo_toy.model:ToyConfig",  # lazy "module:attr": no torch import here
            model="zoo_toy.model:ToyGPT",
            description="byte-level pre-LN GPT without position embeddings (NoPE)",
            blocks=("pre-LN decoder block",),
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
        )
    ]
