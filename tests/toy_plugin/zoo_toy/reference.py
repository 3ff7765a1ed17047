"""What the conformance kit compares toy-gpt with: transformers' GPT-2 with its position
embeddings held at zero (toy-gpt is GPT-2 without positions), its weights read through the
plugin's own layout from the folder the kit wrote."""

import json
from pathlib import Path

import torch
from safetensors.torch import load_file

from zoo_toy.layout import GPT2_KEYS
from zoo_toy.model import ToyConfig

_ACTIVATIONS = {"gelu": "gelu", "gelu_tanh": "gelu_new", "relu": "relu"}


def load(folder: Path):
    import transformers

    values = json.loads((folder / "config.json").read_text())["config"]
    config = ToyConfig(**values)
    hf = transformers.GPT2Config(
        vocab_size=config.vocab_size,
        n_positions=config.context_length,
        n_embd=config.d_model,
        n_head=config.n_heads,
        n_layer=config.n_layers,
        n_inner=config.d_ff,
        activation_function=_ACTIVATIONS[config.activation],
        layer_norm_epsilon=config.layer_norm_eps,
        resid_pdrop=0.0,
        embd_pdrop=0.0,
        attn_pdrop=0.0,
        tie_word_embeddings=False,
        bos_token_id=None,
        eos_token_id=None,
    )
    model = transformers.GPT2LMHeadModel(hf).eval()
    foreign, _ = GPT2_KEYS.from_zoo(load_file(folder / "model.safetensors"), config)
    state = {(k if k == "lm_head.weight" else f"transformer.{k}"): v for k, v in foreign.items()}
    state["transformer.wpe.weight"] = torch.zeros_like(model.transformer.wpe.weight)
    missing, unexpected = model.load_state_dict(state, strict=False)
    if missing or unexpected:
        raise AssertionError(f"GPT-2 missing {missing}, unexpected {unexpected}")

    def logits(input_ids, attention_mask):
        with torch.no_grad():
            return model(input_ids, attention_mask=attention_mask).logits

    return logits
