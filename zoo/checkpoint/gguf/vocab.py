"""A zoo tokenizer as the tokenizer metadata of a GGUF file (llama.cpp's format), and back.

:func:`add_vocab` writes what llama.cpp's ``convert_hf_to_gguf.py`` writes (``tokenizer.ggml.*``:
``model`` ``gpt2`` (byte-level BPE) or ``llama`` (SentencePiece BPE with byte fallback), ``pre``,
``tokens``, ``token_type``, ``scores``, ``merges``, special ids, ``add_bos_token``,
``add_eos_token``, ``add_space_prefix``; ``tokenizer.chat_template``) with the writer's methods,
only where llama.cpp would tokenize exactly as the tokenizer does (else a ``CheckpointError``
says why). :func:`tokenizer_from_metadata` reads it back as a ``tokenizers`` pipeline tokenizing
as llama.cpp does, with roles, sequence tokens, end ids and chat template. Unlike the converter:

- ``pre`` is named from the pipeline (normalizer, splits, ``ignore_merges``), not from a hash
  of the ids of a test text; pipelines no name stands for are refused.
- A byte-level BPE's merges are its own: for tiktoken's ranks (GPT-2's) every split of a token
  in two, by rank (as ``zoo.export`` writes), not ``merges.txt``; the same ids. Where only one
  of the tokenizer and llama.cpp's ``pre`` looks whole words up before merging, the writer
  checks that merging alone gives each vocabulary word its own token.
- SentencePiece ``tokenizer.json``: a token scores by its first merge (llama.cpp joins the
  adjacent pair whose join scores best); the converter copies ``tokenizer.model``'s scores or
  writes -1000 for all. Exact, and checked, when each split of a token into two tokens (or
  characters) is a merge and a token's merges are consecutive (transformers' conversion). Read
  back, each split in two tokens is a merge, best score first, shorter left part first.
- Refused: ``Metaspace`` and decoders but Llama's and Gemma's (llama.cpp's space goes before
  every text fragment); added tokens with ``lstrip``, ``single_word``, or ``rstrip`` but by
  llama.cpp's Phi-3 rule on ``general.name`` (written first); no ``eos``, or for SentencePiece
  no ``bos`` or ``unk`` (llama.cpp would take ids 11 or 2, 1, 0); a ``cls``; over two extra
  end ids (written as ``eot``, ``eom`` unless llama.cpp ends at their text anyway); a BPE
  without merges (gguf writes no empty array); models but ``gpt2`` and ``llama``.
- Read: ``qwen2``, ``olmo``, ``mpt`` with their models' NFC, which llama.cpp skips; splits in
  the library's regex engine; llama.cpp's SentencePiece defaults (bos 1, eos 2, unk 0,
  ``add_bos_token``) but not its byte-level ones (11); end ids: eos, eot, eom, and its texts.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from ... import jsonfile
from ...errors import CheckpointError

if TYPE_CHECKING:
    import gguf

__all__ = ["add_vocab", "tokenizer_from_metadata"]

_K = "tokenizer.ggml."
MODEL, PRE, TOKENS, TYPES = _K + "model", _K + "pre", _K + "tokens", _K + "token_type"
SCORES, MERGES, PREFIX = _K + "scores", _K + "merges", _K + "add_space_prefix"
ADD_BOS, ADD_EOS, ADD_SEP = _K + "add_bos_token", _K + "add_eos_token", _K + "add_sep_token"
TEMPLATE, TEMPLATES = "tokenizer.chat_template", "tokenizer.chat_templates"
#: llama.cpp's token types; it matches unknown, control and user-defined tokens in the raw
#: text before the model (the first two only when special tokens are parsed).
NORMAL, UNKNOWN, CONTROL, USER_DEFINED, UNUSED, BYTE = range(1, 7)
_MATCHED = (UNKNOWN, CONTROL, USER_DEFINED)
#: Role -> (metadata key, GGUFWriter method); eot and eom are llama.cpp's extra end ids.
_IDS = {role: (f"{_K}{key}_token_id", f"add_{role}_token_id") for role, key in (
    ("bos", "bos"), ("eos", "eos"), ("unk", "unknown"), ("pad", "padding"), ("sep", "seperator"),
    ("eot", "eot"), ("eom", "eom"))}  # fmt: skip
#: Texts of the tokens llama.cpp ends a generation at, whatever their ids.
_EOG = frozenset(
    {"<|eot_id|>", "<|im_end|>", "<|end|>", "<end_of_turn>", "<|endoftext|>", "</s>",
     "<|eom_id|>", "<EOT>", "<|end_of_text|>", "<end_of_utterance>", "<eos>"}
)  # fmt: skip
_PHI3_PLAIN = ("<unk>", "<s>", "<|endoftext|>")  # the tokens llama.cpp's Phi-3 rule leaves
_BYTES = frozenset(f"<0x{b:02X}>" for b in range(256))
#: Split regexes by key; :data:`_SPELLINGS` adds other spellings that split alike.
_GPT2 = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)"
_CASE = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|"
_TAIL = r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
_SPLITS = {
    "gpt2": _GPT2 + r"|\s+", "llama3": _CASE + r"\p{N}{1,3}" + _TAIL,
    "qwen2": _CASE + r"\p{N}" + _TAIL, "digit": r"\p{N}", "punct": r"[\p{P}\$\+<=>\^~\|]+",
    "digits": r"\p{N}+", "three": r"[0-9][0-9][0-9]",
}  # fmt: skip
_TIKTOKEN = r"""'(?:[sdmt]|ll|ve|re)| ?\p{L}++| ?\p{N}++| ?[^\s\p{L}\p{N}]++|\s++$|\s+(?!\S)|\s"""
#: A pre-tokenizer step (as JSON, keys sorted) -> its :data:`_SPLITS` key.
_SPELLINGS = {
    json.dumps({"type": "Split", "pattern": {"Regex": p}, "behavior": "Isolated", "invert": False},
               sort_keys=True): key
    for key, p in [*_SPLITS.items(), ("gpt2", _GPT2), ("gpt2", _TIKTOKEN)]
}  # fmt: skip
_SPELLINGS[json.dumps({"individual_digits": True, "type": "Digits"})] = "digit"
#: llama.cpp's byte-level pre-tokenizers zoo writes and reads: name -> (normalizer, splits,
#: whether llama.cpp takes a word that is a token whole, without merging).
_PRES: dict[str, tuple[str | None, tuple[str, ...], bool]] = {
    "gpt-2": (None, ("gpt2",), False), "olmo": ("NFC", ("gpt2",), False),
    "smollm": (None, ("digit", "gpt2"), False), "qwen2": ("NFC", ("qwen2",), False),
    "stablelm2": (None, ("qwen2",), False), "llama-bpe": (None, ("llama3",), True),
    "dbrx": (None, ("llama3",), False),
    "default": (None, ("punct", "gpt2", "digits", "three"), False),
}  # fmt: skip
_ALIASES = {"llama3": "llama-bpe", "llama-v3": "llama-bpe", "mpt": "olmo", "gpt2": "gpt-2"}
_CUTS = 256  # the longest left part of a merge read back (bounds the work on long tokens)


def _fail(where: str, message: str) -> CheckpointError:
    return CheckpointError(f"{where}: {message}")


def _spm_pipeline(prefix: bool) -> tuple[Any, Any]:
    """Normalizer and decoder of llama.cpp's SentencePiece: spaces as "▁", one first in each
    text fragment with ``add_space_prefix`` (Llama's), none without (Gemma's)."""
    from tokenizers import decoders, normalizers

    replace = normalizers.Replace(" ", "▁")
    normalizer = normalizers.Sequence([normalizers.Prepend("▁"), replace]) if prefix else replace
    steps = [decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse()]
    return normalizer, decoders.Sequence(steps + ([decoders.Strip(" ", 1, 0)] if prefix else []))


def _pre_tokenizer(keys: tuple[str, ...]) -> Any:
    """The splits ``keys`` then bytes; GPT-2's regex last is ``ByteLevel``'s own."""
    from tokenizers import Regex, pre_tokenizers

    regex = keys[-1] == "gpt2"
    steps = [pre_tokenizers.Digits(individual_digits=True) if key == "digit"
             else pre_tokenizers.Split(Regex(_SPLITS[key]), behavior="isolated")
             for key in (keys[:-1] if regex else keys)]  # fmt: skip
    byte_level = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=regex)
    return pre_tokenizers.Sequence([*steps, byte_level]) if steps else byte_level


def _rstrip_ids(name: Any, tokens: Sequence[str], types: Sequence[int], where: str) -> set[int]:
    """The ids llama.cpp gives ``rstrip``: by its Phi-3 rule on ``general.name``."""
    if name is not None and not isinstance(name, str):
        raise _fail(where, f"general.name must be a string, not {type(name).__name__}")
    if not name or not any(k in name.lower() for k in ("phi-3", "phi3")):
        return set()
    index = {token: i for i, token in enumerate(tokens)}
    missing = [t for t in ("</s>", *_PHI3_PLAIN) if t not in index]
    if missing:
        raise _fail(where, f"general.name {name!r}: llama.cpp's Phi-3 rule needs {missing}")
    matched = {i for i, kind in enumerate(types) if kind in _MATCHED}
    return ((matched | {index["</s>"]}) - {index[t] for t in _PHI3_PLAIN}) & matched


def add_vocab(writer: gguf.GGUFWriter, tokenizer: Any, *, where: str) -> None:
    """Write ``tokenizer`` (a zoo tokenizer) into ``writer`` as llama.cpp's converter does
    (see the module's description); nothing is written unless all of it can be.

    Raises:
        CheckpointError: the tokenizer cannot be written faithfully; the message says why.
    """
    names = [getattr(d["general.name"], "value", 0) for d in writer.kv_data if "general.name" in d]
    what = f"{where}: tokenizer {getattr(tokenizer, 'name', '?')!r}"
    for method, value in _calls(tokenizer, names[0] if names else None, what):
        getattr(writer, method)(value)


def _calls(tokenizer: Any, name: Any, what: str) -> list[tuple[str, Any]]:
    """The ``GGUFWriter`` calls that write ``tokenizer``, in the converter's order."""
    library, config, kind = _as_library(tokenizer, what)
    tokens, types = _token_list(library, kind, tokenizer.unk_id, what)
    added = library.get_added_tokens_decoder()
    context = any(a.lstrip or a.single_word for a in added.values())
    rstrip = {i for i, a in added.items() if a.rstrip}
    if context or rstrip != _rstrip_ids(name, tokens, types, what):
        raise _fail(what, "some of its added tokens take the text around them, which llama.cpp "
                    "does only by its Phi-3 rule on general.name (to write first)")  # fmt: skip
    calls: list[tuple[str, Any]] = [("add_tokenizer_model", kind)]
    if kind == "gpt2":
        pre, merges = _byte_level(config, what)
        calls += [("add_tokenizer_pre", pre), ("add_token_list", tokens)]
        calls += [("add_token_types", types), ("add_token_merges", merges)]
    else:
        prefix, scores = _sentencepiece(config, tokens, what)
        calls += [("add_token_list", tokens), ("add_token_scores", scores)]
        calls += [("add_token_types", types), ("add_add_space_prefix", prefix)]
    source = tokenizer.chat_template
    if isinstance(source, dict):  # gguf keeps names of ASCII letters, digits and _
        if not all(n.isascii() and n.replace("_", "").isalnum() for n in source):
            raise _fail(what, f"has chat templates {list(source)}, names gguf would change")
        source = [{"name": n, "template": text} for n, text in source.items()]
    calls += _roles(tokenizer, kind, tokens, what)
    return calls + ([] if source is None else [("add_chat_template", source)])


def _as_library(tokenizer: Any, what: str) -> tuple[Any, dict[str, Any], str]:
    """``tokenizer`` as a ``tokenizers`` library, its ``tokenizer.json`` and llama.cpp model."""
    from ..hf_tokenizer import TokenizerExportError, library_of

    try:
        library, _ = library_of(tokenizer, what)
    except TokenizerExportError as exc:
        raise CheckpointError(f"{exc}; nor, then, as GGUF") from None
    config = jsonfile.loads(library.to_str())
    model = config["model"]
    kind = "gpt2" if (config.get("decoder") or {}).get("type") == "ByteLevel" else "llama"
    last = "ignore_merges" if kind == "llama" else "byte_fallback"
    used = [
        o
        for o in ("dropout", "continuing_subword_prefix", "end_of_word_suffix", last)
        if model.get(o)
    ]
    if model.get("type") != "BPE" or used or (kind == "llama" and not model.get("byte_fallback")):
        raise _fail(what, f"a {model.get('type')} model {used or ''}, neither byte-level BPE nor "
                    "BPE with byte fallback (llama.cpp's gpt2 and llama)")  # fmt: skip
    return library, config, kind


def _token_list(library: Any, kind: str, unk: int | None, what: str) -> tuple[list[str], list[int]]:
    """Each id's token and llama.cpp type, as the converter lists them ("[PADn]" in holes)."""
    added = library.get_added_tokens_decoder()
    tokens: list[str] = []
    types: list[int] = []
    for i in range(library.get_vocab_size(with_added_tokens=True)):
        token, entry = library.id_to_token(i), added.get(i)
        tokens.append(f"[PAD{i}]" if token is None else token)
        if token is None:
            types.append(UNUSED)
        elif entry is not None:
            special = UNKNOWN if kind == "llama" and i == unk else CONTROL
            types.append(special if entry.special else USER_DEFINED)
        else:
            types.append(BYTE if kind == "llama" and token in _BYTES else NORMAL)
    if len(set(tokens)) < len(tokens) or "" in tokens:
        raise _fail(what, "has a token twice, or an empty one: llama.cpp refuses both")
    return tokens, types


def _pairs(model: Mapping[str, Any]) -> list[tuple[str, str]]:
    """The merges of a ``tokenizer.json`` model (either format) as pairs."""
    merges = [m.split(" ", 1) if isinstance(m, str) else m for m in model.get("merges") or []]
    return [(m[0], m[-1]) for m in merges]


def _byte_level(config: Mapping[str, Any], what: str) -> tuple[str, list[str]]:
    """The ``pre`` name and the merges of a byte-level BPE."""
    model, pairs = config["model"], _pairs(config["model"])
    if not pairs or any(" " in a + b for a, b in pairs):
        raise _fail(what, f"has no merges (llama.cpp needs {MERGES}; gguf writes no empty "
                    "array) or one with a space (llama.cpp's separator)")  # fmt: skip
    normalizer, pre = config.get("normalizer"), config.get("pre_tokenizer")
    norm = None if normalizer is None else "NFC" if normalizer == {"type": "NFC"} else "?"
    keys = _split_keys(pre)
    names = [n for n, (normal, splits, _) in _PRES.items() if (normal, splits) == (norm, keys)]
    if not names:
        shown = json.dumps([normalizer, pre], ensure_ascii=False)[:300]
        raise _fail(what, f"its normalizer and pre-tokenizer ({shown}) are none of llama.cpp's "
                    f"that zoo writes ({', '.join(_PRES)})")  # fmt: skip
    whole = bool(model.get("ignore_merges"))
    name = next((n for n in names if _PRES[n][2] == whole), names[0])
    if _PRES[name][2] != whole and not _merges_reach_vocab(model["vocab"], pairs, what):
        raise _fail(what, f"looks words up before merging, llama.cpp's {name!r} does not, and "
                    "some words do not come out of its merges")  # fmt: skip
    return name, [f"{a} {b}" for a, b in pairs]


def _split_keys(pre: Any) -> tuple[str, ...] | None:
    """The splits of a byte-level pre-tokenizer as :data:`_SPLITS` keys; ``None`` for others."""
    pre = pre or {}
    *steps, last = pre.get("pretokenizers") or [{}] if pre.get("type") == "Sequence" else [pre]
    keys = [_SPELLINGS.get(json.dumps(step, sort_keys=True), "?") for step in steps]
    if "?" in keys or last.get("type") != "ByteLevel" or last.get("add_prefix_space"):
        return None
    return (*keys, "gpt2") if last.get("use_regex", True) else tuple(keys)


def _merges_reach_vocab(vocab: Mapping[str, int], pairs: list[Any], what: str) -> bool:
    """Whether merging alone gives every vocabulary word its own token (then looking a word
    up before merging changes nothing)."""
    from tokenizers import Tokenizer, models

    bpe = _build(what, Tokenizer, models.BPE(vocab=dict(vocab), merges=pairs))
    words = [word for word in vocab if len(word) > 1]
    encoded = _build(what, bpe.encode_batch_fast, words, add_special_tokens=False)
    return all(e.ids == [vocab[w]] for w, e in zip(words, encoded, strict=True))


def _sentencepiece(config: Any, tokens: list[str], what: str) -> tuple[bool, list[float]]:
    """``add_space_prefix`` and the scores of a SentencePiece-style BPE."""
    parts = [config.get("normalizer"), config.get("decoder")]
    ours = {p: [jsonfile.loads(x.__getstate__()) for x in _spm_pipeline(p)] for p in (True, False)}
    found = [prefix for prefix, expected in ours.items() if parts == expected]
    pre = config.get("pre_tokenizer")
    split = pre is None or (pre.get("type"), pre.get("pattern")) == ("Split", {"String": " "})
    if not found or not split:
        shown = json.dumps([*parts, pre], ensure_ascii=False)[:300]
        raise _fail(what, f"its normalizer, decoder and pre-tokenizer ({shown}) are not "
                    "llama.cpp's SentencePiece (spaces as ▁, one first or none)")  # fmt: skip
    missing = sorted(_BYTES - set(tokens))
    if missing:
        raise _fail(what, f"lacks byte tokens llama.cpp falls back to: {missing[:4]}")
    return found[0], _scores(tokens, _pairs(config["model"]), what)


def _scores(tokens: list[str], pairs: list[tuple[str, str]], what: str) -> list[float]:
    """Scores under which llama.cpp's SentencePiece (join the adjacent pair whose join scores
    best, any pair whose join is a token) merges as the BPE's ``pairs`` do."""
    first: dict[str, int] = {}
    for rank, (a, b) in enumerate(pairs):
        start = first.setdefault(a + b, rank)
        if start != rank and first.get("".join(pairs[rank - 1])) != start:
            raise _fail(what, f"its merges making {a + b!r} are not consecutive, and llama.cpp "
                        "ranks a merge by the token it makes")  # fmt: skip
    known, merges = set(tokens), set(pairs)
    for token in tokens:
        for cut in range(1, len(token)):
            a, b = token[:cut], token[cut:]
            if (a in known or len(a) == 1) and (b in known or len(b) == 1) and (a, b) not in merges:
                raise _fail(what, f"has no merge {a!r} + {b!r}, which llama.cpp's SentencePiece "
                            f"makes into {token!r}")  # fmt: skip
    return [-1.0 - first[token] if token in first else 0.0 for token in tokens]


def _roles(tokenizer: Any, kind: str, tokens: list[str], what: str) -> list[tuple[str, Any]]:
    """The calls that write the special ids and ``add_bos_token`` / ``add_eos_token``."""
    roles, (prefix, suffix) = tokenizer.roles, tokenizer._wrap
    needed = ("bos", "eos", "unk") if kind == "llama" else ("eos",)
    missing = [role for role in needed if role not in roles]
    if missing or "cls" in roles:
        raise _fail(what, f"has no {' or '.join(missing)} token (llama.cpp would take a default "
                    "id), or a cls token (GGUF has no key for one)")  # fmt: skip
    ids = {role: getattr(tokenizer, f"{role}_id") for role in roles}
    extra = [i for i in tokenizer.end_ids if i != ids["eos"] and tokens[i] not in _EOG]
    if len(extra) > 2 or prefix not in (None, "bos") or suffix not in (None, "eos"):
        raise _fail(what, f"ends at {len(extra) + 1} ids (GGUF holds eos, eot, eom) or wraps a "
                    f"sequence in {prefix}, {suffix} (llama.cpp adds bos, eos)")  # fmt: skip
    ids.update(zip(("eot", "eom"), extra, strict=False))
    calls = [(_IDS[role][1], token_id) for role, token_id in ids.items()]
    return [*calls, ("add_add_bos_token", prefix == "bos"), ("add_add_eos_token", suffix == "eos")]


def tokenizer_from_metadata(metadata: Mapping[str, Any], *, where: str) -> Any | None:
    """The zoo tokenizer the GGUF ``metadata`` describes (values already parsed to Python),
    or ``None`` when it has no ``tokenizer.ggml.model``. Nothing in the metadata runs: the
    chat template is rendered in zoo's sandbox, and only when used.

    Raises:
        CheckpointError: a model or pre-tokenizer zoo does not read, or metadata of the wrong
            type, out of range or inconsistent; the message names the key.
    """
    if MODEL not in metadata:
        return None
    model: str = _value(metadata, MODEL, str, where)
    if model not in ("gpt2", "llama"):
        raise _fail(where, f"{MODEL} is {model!r}: zoo reads llama.cpp's 'gpt2' (byte-level "
                    "BPE) and 'llama' (SentencePiece) vocabularies only")  # fmt: skip
    tokens = _strings(metadata, TOKENS, where, required=True)
    index = {token: i for i, token in enumerate(tokens)}
    if len(index) < len(tokens) or "" in index:
        raise _fail(where, f"{TOKENS} holds a token twice, or an empty one")
    types = _value(metadata, TYPES, list, where) or [NORMAL] * len(tokens)
    if len(types) != len(tokens) or not all(type(t) is int and 1 <= t <= 6 for t in types):
        raise _fail(where, f"{TYPES} must be {len(tokens)} llama.cpp token types (1 to 6)")
    ids = _read_ids(metadata, model, len(tokens), where)
    pre = _pre_name(metadata, where) if model == "gpt2" else _value(metadata, PRE, str, where)
    if model == "gpt2":
        library = _gpt2_library(metadata, index, pre, where)
    else:
        library = _llama_library(metadata, tokens, ids.get("unk"), where)
    _add_matched(library, metadata, tokens, types, where)
    wrap = _wrap(metadata, model == "llama" or pre == "llama-bpe", ids, where)
    about = f"llama.cpp {model} vocabulary ({pre or 'SentencePiece'}) from {where}"
    return _zoo_tokenizer(library, metadata, tokens, ids, wrap, about, where)


def _value(meta: Mapping[str, Any], key: str, kind: type, where: str, default: Any = None) -> Any:
    """``meta[key]`` (``default`` if absent), refused unless of type ``kind``."""
    value = meta.get(key)
    if value is not None and type(value) is not kind:
        raise _fail(where, f"{key} must be a {kind.__name__}, not {type(value).__name__}")
    return default if value is None else value


def _strings(metadata: Mapping[str, Any], key: str, where: str, required: bool) -> list[str]:
    value = _value(metadata, key, list, where)
    if (value is None and required) or not all(type(item) is str for item in value or []):
        raise _fail(where, f"{key} must be a list of strings")
    return list(value or [])


def _read_ids(metadata: Mapping[str, Any], model: str, n: int, where: str) -> dict[str, int]:
    """Role (and eot, eom) -> id; a SentencePiece vocabulary gets llama.cpp's defaults."""
    defaults = {"bos": 1, "eos": 2, "unk": 0} if model == "llama" else {}
    ids: dict[str, int] = {}
    for role, (key, _) in _IDS.items():
        token_id = _value(metadata, key, int, where, defaults.get(role))
        if token_id is not None and not 0 <= token_id < n and key in metadata:
            raise _fail(where, f"{key} is {token_id}, outside the vocabulary's ids 0 .. {n - 1}")
        if token_id is not None and token_id < n:
            ids[role] = token_id
    return ids


def _pre_name(metadata: Mapping[str, Any], where: str) -> str:
    pre = _value(metadata, PRE, str, where, "default")  # llama.cpp's when there is none
    if _ALIASES.get(pre, pre) not in _PRES:
        known = ", ".join(sorted([*_PRES, *_ALIASES]))
        raise _fail(where, f"{PRE} is {pre!r}, a pre-tokenizer zoo does not read ({known})")
    return _ALIASES.get(pre, pre)


def _gpt2_library(metadata: Mapping[str, Any], index: dict[str, int], pre: str, where: str) -> Any:
    from tokenizers import Tokenizer, decoders, models, normalizers

    pairs: list[tuple[str, str]] = []
    for i, merge in enumerate(_strings(metadata, MERGES, where, required=True)):
        cut = merge.find(" ", 1)  # as llama.cpp cuts it
        a, b = (merge[:cut], merge[cut + 1 :]) if cut > 0 else (merge, "")
        if cut < 0 or a not in index or b not in index or a + b not in index:
            raise _fail(where, f"{MERGES}[{i}] is {merge[:80]!r}, not 'a b' with a, b, ab tokens")
        pairs.append((a, b))
    if len(set(pairs)) != len(pairs):
        raise _fail(where, f"{MERGES} gives a merge twice")
    norm, keys, whole = _PRES[pre]
    library = _build(where, Tokenizer, models.BPE(vocab=index, merges=pairs, ignore_merges=whole))
    library.normalizer = normalizers.NFC() if norm else None
    library.pre_tokenizer = _pre_tokenizer(keys)
    library.decoder = decoders.ByteLevel()
    return library


def _llama_library(meta: Mapping[str, Any], tokens: list[str], unk: int | None, where: str) -> Any:
    from tokenizers import Tokenizer, models

    index = {token: i for i, token in enumerate(tokens)}
    scores = _value(meta, SCORES, list, where, [])
    finite = all(type(s) in (int, float) and math.isfinite(s) for s in scores)
    if len(scores) != len(tokens) or not finite:
        raise _fail(where, f"{SCORES} must be {len(tokens)} finite numbers, one per token")
    missing = sorted(_BYTES - set(index))
    if missing:
        raise _fail(where, f"{TOKENS} lacks the byte tokens llama.cpp falls back to: {missing[:4]}")
    joins = [(-scores[i], i, cut, index[token[:cut]], index[token[cut:]])
             for i, token in enumerate(tokens) for cut in range(1, min(len(token), _CUTS + 1))
             if token[:cut] in index and token[cut:] in index]  # fmt: skip
    merges = [(tokens[a], tokens[b]) for *_, a, b in sorted(joins)]
    unk_token = None if unk is None else tokens[unk]
    bpe = models.BPE(index, merges, byte_fallback=True, fuse_unk=True, unk_token=unk_token)
    library = _build(where, Tokenizer, bpe)
    library.normalizer, library.decoder = _spm_pipeline(_value(meta, PREFIX, bool, where, True))
    return library


def _build(where: str, make: Any, *args: Any, **kwargs: Any) -> Any:
    """``make(*args, **kwargs)`` in the library, what it refuses as a CheckpointError."""
    from ...tokenizers.hf_backend import call_library

    try:
        return call_library(make, *args, **kwargs)
    except Exception as exc:  # the library raises plain Exception on what it refuses
        raise _fail(where, f"the tokenizers library refused the vocabulary: {exc}") from None


def _add_matched(
    library: Any, metadata: Mapping[str, Any], tokens: list[str], types: list[int], where: str
) -> None:
    """Control and unknown tokens as special added tokens, user-defined ones as plain added
    tokens: matched in the raw text before the model, as llama.cpp matches them."""
    from tokenizers import AddedToken

    rstrip = _rstrip_ids(metadata.get("general.name"), tokens, types, where)
    for special, kinds in ((True, (UNKNOWN, CONTROL)), (False, (USER_DEFINED,))):
        added = [
            AddedToken(t, special=special, normalized=False, rstrip=i in rstrip)
            for i, t in enumerate(tokens)
            if types[i] in kinds
        ]
        _build(where, library.add_special_tokens if special else library.add_tokens, added)


def _wrap(meta: Mapping[str, Any], bos: bool, ids: dict[str, int], where: str) -> tuple[Any, Any]:
    """The roles added around a sequence: ``add_bos_token`` (default ``bos``) and
    ``add_eos_token``; zoo adds no separator."""
    adds = [(role, key, _value(meta, key, bool, where, default)) for role, key, default in
            (("bos", ADD_BOS, bos), ("eos", ADD_EOS, False), ("sep", ADD_SEP, False))]  # fmt: skip
    absent = [key for role, key, add in adds if add and (role not in ids or role == "sep")]
    if absent:
        raise _fail(where, f"{absent[0]} is true, and there is no such token zoo adds")
    return ("bos" if adds[0][2] else None, "eos" if adds[1][2] else None)


def _zoo_tokenizer(
    library: Any, metadata: Mapping[str, Any], tokens: list[str], ids: dict[str, int],
    wrap: tuple[Any, Any], about: str, where: str,
) -> Any:  # fmt: skip
    from ...tokenizers.chat import ChatTemplate
    from ...tokenizers.errors import TokenizerError
    from ...tokenizers.hf_backend import HFTokenizer

    roles = {role: tokens[i] for role, i in ids.items() if role not in ("eot", "eom")}
    ends = [ids[r] for r in ("eos", "eot", "eom") if r in ids]
    ends += [i for i, token in enumerate(tokens) if token in _EOG]
    templates = {"default": _value(metadata, TEMPLATE, str, where)}
    for name in _strings(metadata, TEMPLATES, where, required=False):
        templates[name] = _value(metadata, f"{TEMPLATE}.{name}", str, where)
        if templates[name] is None:
            raise _fail(where, f"{TEMPLATES} names {name!r}, and {TEMPLATE}.{name} is missing")
    templates = {name: source for name, source in templates.items() if source is not None}
    variables = {f"{role}_token": token for role, token in roles.items()}
    chat = ChatTemplate(templates, variables) if templates else None
    try:
        return HFTokenizer(library, name="gguf", roles=roles, wrap=wrap, description=about,
                           chat=chat, end_ids=ends)  # fmt: skip
    except TokenizerError as exc:
        raise _fail(where, f"the GGUF vocabulary is not a consistent tokenizer: {exc}") from None
