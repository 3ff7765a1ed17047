"""Checkpoints: save and load zoo models with safetensors in local directories, import and
export foreign (Hugging Face) layouts. Sources elsewhere (``hf:org/name``, a named model's
Hub weights) are :func:`zoo.load`'s: it resolves them to a directory first (:mod:`zoo.loading`);
this package never reaches the network.

    >>> import zoo
    >>> zoo.save(model, "ckpt/")                 # model.safetensors + config.json
    >>> zoo.save(model, "ckpt/", max_shard_size="5GB")   # shards + index, as transformers
    >>> model = zoo.load("ckpt/", device="cuda", dtype=torch.bfloat16)
    >>> model.tokenizer                           # loaded with it (None when there is none)
    >>> model = zoo.load("path/to/hf-gpt2-dir")   # a transformers save_pretrained directory
    >>> zoo.export(model, "hf-out/")              # transformers.GPT2LMHeadModel.from_pretrained

How loading works: the model is built on the ``meta`` device, the safetensors file is
memory-mapped and its tensors are assigned as the parameters (no random initialisation, no
second copy on the CPU), tied weights are re-tied to one tensor, non-persistent buffers are
recreated on the target device (see :mod:`zoo.checkpoint.state` for the plugin-author
convention), and the sha256 recorded at save time (or pinned for a named model) is verified.
A sharded checkpoint (``model.safetensors.index.json`` and its shards) loads the same way,
every shard memory-mapped and verified, its index checked as untrusted input.

Modules: :mod:`.files` (safetensors, hashing, atomic writes), :mod:`.manifest`
(``config.json``), :mod:`.shards` (sharded checkpoints: the index, splitting, verifying),
:mod:`.reshard` (a saved folder split another way), :mod:`.state` (meta build and
assignment), :mod:`.load` (:func:`load_local`: recognising, reading and verifying the
files), :mod:`.write` (:func:`save` and :func:`export`), :mod:`.tokenizer` (the tokenizer a
checkpoint comes with), :mod:`.generation_file` (``generation_config.json``: the generation
defaults it comes with), :mod:`.pickled` (the opt-in pickle converter); Hugging Face
checkpoints: :mod:`.readers` (what a folder holds), :mod:`.hf_layout` (key maps),
:mod:`.hf_config` (``config.json``: :mod:`.hf_keys`, :mod:`.hf_reader`, :mod:`.hf_format`),
:mod:`.hf_tokenizer` (tokenizer files on export).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .._lazy import lazy_attributes

if TYPE_CHECKING:  # type checkers see the real names
    from .files import WEIGHTS_FILE, forget_verified, sha256_file
    from .load import WEIGHTS_DIR_ENV, load_local, local_weights_path
    from .manifest import CONFIG_FILE, FORMAT_VERSION, Manifest
    from .pickled import convert_pickle_checkpoint
    from .report import LoadReport, ShapeMismatch
    from .state import materialize_buffers
    from .write import export, save

__all__ = [
    "CONFIG_FILE",
    "FORMAT_VERSION",
    "WEIGHTS_DIR_ENV",
    "WEIGHTS_FILE",
    "LoadReport",
    "Manifest",
    "ShapeMismatch",
    "convert_pickle_checkpoint",
    "export",
    "forget_verified",
    "load_local",
    "local_weights_path",
    "materialize_buffers",
    "save",
    "sha256_file",
]

#: Imported on first use, so that importing one module of the package (a plugin's
#: ``hf_layout``, say) runs neither the loader nor the registry it stands on.
__getattr__ = lazy_attributes(
    __name__,
    {
        "WEIGHTS_FILE": "zoo.checkpoint.files:WEIGHTS_FILE",
        "forget_verified": "zoo.checkpoint.files:forget_verified",
        "sha256_file": "zoo.checkpoint.files:sha256_file",
        "WEIGHTS_DIR_ENV": "zoo.checkpoint.load:WEIGHTS_DIR_ENV",
        "load_local": "zoo.checkpoint.load:load_local",
        "local_weights_path": "zoo.checkpoint.load:local_weights_path",
        "CONFIG_FILE": "zoo.checkpoint.manifest:CONFIG_FILE",
        "FORMAT_VERSION": "zoo.checkpoint.manifest:FORMAT_VERSION",
        "Manifest": "zoo.checkpoint.manifest:Manifest",
        "convert_pickle_checkpoint": "zoo.checkpoint.pickled:convert_pickle_checkpoint",
        "LoadReport": "zoo.checkpoint.report:LoadReport",
        "ShapeMismatch": "zoo.checkpoint.report:ShapeMismatch",
        "materialize_buffers": "zoo.checkpoint.state:materialize_buffers",
        "export": "zoo.checkpoint.write:export",
        "save": "zoo.checkpoint.write:save",
    },
)
