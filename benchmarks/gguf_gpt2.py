"""A GPT-2 checkpoint in Hugging Face's layout written as GGUF for llama.cpp, in float32 or
q8_0, with the ``gguf`` package (``pip install gguf``), choosing per tensor what llama.cpp's
own ``convert_hf_to_gguf.py --outtype q8_0`` chooses: 2-D weights in q8_0 but the position
table, norms and biases in float32, Conv1D weights transposed, the head tied to the token
embedding. The vocabulary is a stand-in (tokens ``t0`` ..): the benchmarks feed token ids.

    python benchmarks/gguf_gpt2.py HF_FOLDER OUT.gguf --type q8_0
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

TYPES = ("f32", "q8_0")
_TRANSPOSED = (".c_attn.weight", ".c_proj.weight", ".c_fc.weight")  # Conv1D: (in, out)


def convert(hf_folder: Path, out: Path, kind: str = "f32") -> Path:
    """Write ``hf_folder`` (``config.json`` + ``model.safetensors`` of a GPT-2) to ``out``."""
    import gguf
    import numpy as np
    from safetensors.numpy import load_file

    if kind not in TYPES:
        raise ValueError(f"kind must be one of {TYPES}, not {kind!r}")
    config = json.loads((hf_folder / "config.json").read_text())
    n_embd, n_layer, vocab = config["n_embd"], config["n_layer"], config["vocab_size"]
    arch = gguf.MODEL_ARCH.GPT2
    writer = gguf.GGUFWriter(str(out), gguf.MODEL_ARCH_NAMES[arch])
    writer.add_block_count(n_layer)
    writer.add_context_length(config["n_positions"])
    writer.add_embedding_length(n_embd)
    writer.add_feed_forward_length(config.get("n_inner") or 4 * n_embd)
    writer.add_head_count(config["n_head"])
    writer.add_layer_norm_eps(config["layer_norm_epsilon"])
    q8 = kind == "q8_0"
    writer.add_file_type(gguf.LlamaFileType.MOSTLY_Q8_0 if q8 else gguf.LlamaFileType.ALL_F32)
    writer.add_tokenizer_model("gpt2")
    writer.add_token_list([f"t{i}" for i in range(vocab)])
    writer.add_token_types([gguf.TokenType.NORMAL] * vocab)
    writer.add_token_merges(["t 0"])  # llama.cpp's BPE vocabulary needs one; ids are fed
    writer.add_bos_token_id(vocab - 1)
    writer.add_eos_token_id(vocab - 1)
    names = gguf.get_tensor_name_map(arch, n_layer)
    for name, data in load_file(str(hf_folder / "model.safetensors")).items():
        if name.endswith((".attn.bias", ".attn.masked_bias")) or name == "lm_head.weight":
            continue  # the causal mask buffers; the head is the tied token embedding
        new = names.get_name(name.removeprefix("transformer."), try_suffixes=(".weight", ".bias"))
        if new is None:
            raise ValueError(f"{name}: no GGUF name for it in llama.cpp's GPT-2 map")
        data = np.ascontiguousarray(data.T if name.endswith(_TRANSPOSED) else data, np.float32)
        quantize = q8 and data.ndim == 2 and not new.startswith("position_embd")
        if quantize:
            kind_q = gguf.GGMLQuantizationType.Q8_0
            writer.add_tensor(new, gguf.quants.quantize(data, kind_q), raw_dtype=kind_q)
        else:
            writer.add_tensor(new, data)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("hf_folder", type=Path)
    parser.add_argument("out", type=Path)
    parser.add_argument("--type", choices=TYPES, default="f32")
    args = parser.parse_args()
    print(convert(args.hf_folder, args.out, args.type))


if __name__ == "__main__":
    main()
