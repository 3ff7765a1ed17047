"""zoo.checkpoint.gguf.vocab: a zoo tokenizer into a GGUF file's tokenizer metadata and back.

Each tokenizer the named models use that llama.cpp can hold is written with ``add_vocab`` into
a real GGUF file (``gguf.GGUFWriter``), the header read back with
``zoo.checkpoint.gguf.header``, and
rebuilt with ``tokenizer_from_metadata``: the ids of held-out text (scripts, whitespace runs,
digits, emoji, special tokens' text, leading spaces) and their decoding, the special ids, the
sequence tokens and the chat template must be the original's. Only GPT-2's ranks ship in the
repo; the other vocabularies are trained here, small, in each model's own pipeline
(normalizer, split, added tokens, roles and chat template from the vendored
``tokenizer_config.json`` where there is one), which is what decides how llama.cpp must be
told about them. SentencePiece scores are also checked against a transcription of llama.cpp's
merge loop. Hostile metadata is read in a child process, whose exit the test asserts on.
"""

from __future__ import annotations

import itertools
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import gguf
import pytest
import sentencepiece
import tokenizers
from spm_vocab import LINES, train_spm
from tokenizers import AddedToken, Regex, decoders, models, normalizers, pre_tokenizers, trainers

import zoo
from zoo import jsonfile
from zoo.checkpoint.gguf.header import read_header
from zoo.checkpoint.gguf.vocab import add_vocab, tokenizer_from_metadata
from zoo.tokenizers import ChatTemplate, HFTokenizer, from_pretrained

DATA = Path(__file__).parent / "data"
K = "tokenizer.ggml."

#: Lines in other scripts, so the trained vocabularies have words in them too.
WORLD = [
    "Grüße aus München, ça va très bien; déjà vu à Besançon.",
    "Съешь же ещё этих мягких французских булок, да выпей чаю.",
    "日本語の文章と中文的句子，还有更多的汉字在这里。",
    "한국어 문장도 여기에 있습니다.",
    "مرحبا بالعالم، هذا نص عربي قصير.",
    "नमस्ते दुनिया, यह हिंदी पाठ है।",
    "Numbers 2024 and 3.14159, 1,000,000 and 42; emoji 😀🎉 ✅.",
    "def main(argv):\n    return {'key': [1, 2, 3]}  # code\n",
]
CORPUS = LINES[:1500] + WORLD * 5

#: Held out: not the training text.
HELD_OUT = [
    "Hello, world! It's a test: we'll see, they've done it, I'M SURE.",
    "  two leading spaces,   three inside,\ttab\n\nnew lines \n trailing   ",
    " one leading space",
    "Grüße, Ñandú, ØRESUND — naïve façade; Ærø.",
    "Быстрая коричневая лиса прыгает через ленивую собаку.",
    "東京都の天気は晴れです。我们明天见。서울에서 만나요.",
    "السلام عليكم  ورحمة الله",
    "Digits 0 12 345 6789 1234567890, 3.14159, ١٢٣, ²³ and ½.",
    "Emoji 😀🎉👍🏽 family 👨\u200d👩\u200d👧 flag 🇫🇷 ✅!!",
    "code:\n\tdef f(x):\n\t\treturn x ** 2  # square\n\n\n",
    "e\u0301 combines, \ufb01 ligature, \u00a0no-break, zero\u200bwidth",
    "",
    "a",
]
CONVERSATION = [
    {"role": "system", "content": "Be brief."},
    {"role": "user", "content": "What is 2 + 3?"},
    {"role": "assistant", "content": "5."},
    {"role": "user", "content": "And  times 4?"},
]


# -- the tokenizers ----------------------------------------------------------------------


def byte_level(
    pre: Any, *, normalizer: Any = None, whole: bool = False, head: tuple[str, ...] = ()
) -> Any:
    """A byte-level BPE trained on :data:`CORPUS` in the pipeline given (``head``: special
    tokens at the first ids, as SmolLM2 and GPT-NeoX have them)."""
    library = tokenizers.Tokenizer(models.BPE())
    library.normalizer, library.pre_tokenizer = normalizer, pre
    library.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=900,
        special_tokens=list(head),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    library.train_from_iterator(CORPUS, trainer)
    state = jsonfile.loads(library.to_str())
    state["model"]["ignore_merges"] = whole
    return tokenizers.Tokenizer.from_str(json.dumps(state))


def split(regex: str) -> Any:
    return pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(regex), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )


QWEN = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+"
)
LLAMA3 = QWEN.replace(r"|\p{N}|", r"|\p{N}{1,3}|")


def hub_config(repo: str) -> dict[str, Any]:
    config: dict[str, Any] = jsonfile.loads(
        (DATA / "hub" / repo / "tokenizer_config.json").read_text()
    )
    return config


def head(repo: str) -> tuple[str, ...]:
    """The added tokens ``repo`` has at the first ids (SmolLM2's), in id order."""
    added = hub_config(repo)["added_tokens_decoder"]
    return tuple(added[str(i)]["content"] for i in range(len(added)) if str(i) in added)


def hub_folder(folder: Path, library: Any, repo: str) -> Any:
    """A Hugging Face folder: ``library`` with the added tokens, roles and chat template of
    ``repo``'s vendored ``tokenizer_config.json`` (ids moved onto ``library``'s), read as zoo
    reads a named model's tokenizer."""
    config = hub_config(repo)
    moved = {}
    for old, entry in sorted(config["added_tokens_decoder"].items(), key=lambda e: int(e[0])):
        token = AddedToken(entry["content"], special=entry["special"], normalized=False)
        (library.add_special_tokens if entry["special"] else library.add_tokens)([token])
        moved[int(old)] = library.token_to_id(entry["content"])
    config["added_tokens_decoder"] = {
        str(moved[int(k)]): v for k, v in config["added_tokens_decoder"].items()
    }
    generation = jsonfile.loads((DATA / "hub" / repo / "generation_config.json").read_text())
    ends = generation["eos_token_id"]
    ends = [moved[i] for i in ends] if isinstance(ends, list) else moved[ends]
    return hf_folder(folder, library, config, ends)


def hf_folder(folder: Path, library: Any, config: dict[str, Any], ends: Any = None) -> Any:
    folder.mkdir(parents=True, exist_ok=True)
    library.save(str(folder / "tokenizer.json"))
    (folder / "tokenizer_config.json").write_text(json.dumps(config))
    if ends is not None:
        (folder / "generation_config.json").write_text(json.dumps({"eos_token_id": ends}))
    return from_pretrained(folder)


def spm_library(
    folder: Path, *, prefix: bool, added: tuple[AddedToken, ...] = (), **options: Any
) -> Any:
    """A SentencePiece BPE (byte fallback) trained on :data:`CORPUS`, as transformers writes
    its ``tokenizer.json``: every split of a piece into two pieces is a merge, in piece order;
    Llama's spaces (``prefix``) or Gemma's."""
    path = train_spm(
        CORPUS,
        folder / "spm",
        700,
        model_type="bpe",
        byte_fallback=True,
        add_dummy_prefix=prefix,
        character_coverage=0.9995,
        **options,
    )
    spm = sentencepiece.SentencePieceProcessor(model_file=str(path))
    vocab = {spm.id_to_piece(i): i for i in range(spm.get_piece_size())}
    merges = [
        (p[:c], p[c:]) for p in vocab for c in range(1, len(p)) if p[:c] in vocab and p[c:] in vocab
    ]
    unk = spm.id_to_piece(spm.unk_id())
    library = tokenizers.Tokenizer(
        models.BPE(vocab, merges, unk_token=unk, byte_fallback=True, fuse_unk=True)
    )
    replace = normalizers.Replace(" ", "▁")
    library.normalizer = (
        normalizers.Sequence([normalizers.Prepend("▁"), replace]) if prefix else replace
    )
    steps = [decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse()]
    library.decoder = decoders.Sequence(steps + ([decoders.Strip(" ", 1, 0)] if prefix else []))
    if not prefix:
        library.pre_tokenizer = pre_tokenizers.Split(" ", "merged_with_previous")
    controls = [
        spm.id_to_piece(i)
        for i in range(spm.get_piece_size())
        if spm.is_control(i) or spm.is_unknown(i)
    ]
    library.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in controls])
    library.add_special_tokens([t for t in added if t.special])
    library.add_tokens([t for t in added if not t.special])
    return library


PHI3_TEMPLATE = (
    "{% for m in messages %}{{ '<|' + m['role'] + '|>\n' + m['content'] + '<|end|>\n' }}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|assistant|>\n' }}{% endif %}"
)


LLAMA_ROLES = {"bos": "<s>", "eos": "</s>", "unk": "<unk>"}


def _tinyllama(folder: Path) -> Any:
    config = {
        **{f"{role}_token": token for role, token in LLAMA_ROLES.items()},
        "pad_token": "</s>",
        "add_bos_token": True,
        "add_eos_token": False,
        "chat_template": (DATA / "chat_templates" / "tinyllama-chat.jinja").read_text(),
    }
    return hf_folder(folder, spm_library(folder, prefix=True), config, 2)


def _gemma(folder: Path) -> Any:
    library = spm_library(
        folder,
        prefix=False,
        pad_id=0,
        eos_id=1,
        bos_id=2,
        unk_id=3,
        pad_piece="<pad>",
        eos_piece="<eos>",
        bos_piece="<bos>",
        control_symbols=["<start_of_turn>", "<end_of_turn>"],
    )
    roles = {"bos": "<bos>", "eos": "<eos>", "unk": "<unk>", "pad": "<pad>"}
    config: dict[str, Any] = {f"{role}_token": token for role, token in roles.items()}
    config |= {"add_bos_token": True, "add_eos_token": False}
    return hf_folder(folder, library, config, [1, library.token_to_id("<end_of_turn>")])


def _phi3(folder: Path) -> Any:
    names = ["<|endoftext|>", "<|assistant|>", "<|end|>", "<|user|>", "<|system|>"]
    added = tuple(
        AddedToken(t, special=True, normalized=False, rstrip=t != "<|endoftext|>") for t in names
    )
    library = spm_library(folder, prefix=True, added=added)
    library.add_special_tokens([AddedToken("</s>", special=True, normalized=False, rstrip=True)])
    config = {
        "bos_token": "<s>",
        "eos_token": "<|endoftext|>",
        "unk_token": "<unk>",
        "pad_token": "<|endoftext|>",
        "add_bos_token": False,
        "add_eos_token": False,
        "chat_template": PHI3_TEMPLATE,
    }
    ends = [library.token_to_id(t) for t in ("<|endoftext|>", "<|assistant|>", "<|end|>")]
    return hf_folder(folder, library, config, ends)


def _pythia(folder: Path) -> Any:
    library = byte_level(
        pre_tokenizers.ByteLevel(add_prefix_space=False),
        normalizer=normalizers.NFC(),
        head=("<|endoftext|>", "<|padding|>"),
    )
    library.add_tokens([AddedToken(" " * n, special=False, normalized=True) for n in (24, 8, 4, 2)])
    config = {
        "bos_token": "<|endoftext|>",
        "eos_token": "<|endoftext|>",
        "unk_token": "<|endoftext|>",
    }
    return hf_folder(folder, library, config)


def _gpt2(folder: Path) -> Any:
    return zoo.tokenizer("gpt2-124m")  # tiktoken, shipped


def _subword(folder: Path) -> Any:
    return zoo.tokenizers.SubwordBPE.train(CORPUS, vocab_size=700)  # transformer-encdec's


def _smollm2(folder: Path) -> Any:
    repo = "HuggingFaceTB/SmolLM2-135M-Instruct"
    digits = pre_tokenizers.Digits(individual_digits=True)
    pre = pre_tokenizers.Sequence([digits, pre_tokenizers.ByteLevel(add_prefix_space=False)])
    return hub_folder(folder, byte_level(pre, head=head(repo)), repo)


def _qwen(repo: str) -> Any:
    def make(folder: Path) -> Any:
        return hub_folder(folder, byte_level(split(QWEN), normalizer=normalizers.NFC()), repo)

    return make


def _olmo2(folder: Path) -> Any:
    return hub_folder(folder, byte_level(split(LLAMA3)), "allenai/OLMo-2-0425-1B-Instruct")


def _llama3(folder: Path) -> Any:
    library = byte_level(split(LLAMA3), whole=True, head=("<|begin_of_text|>", "<|end_of_text|>"))
    config = {
        "bos_token": "<|begin_of_text|>",
        "eos_token": "<|end_of_text|>",
        "add_bos_token": True,
    }
    return hf_folder(folder, library, config)


def _stablelm2(folder: Path) -> Any:
    library = byte_level(split(QWEN), head=("<|endoftext|>",))
    return hf_folder(folder, library, {"eos_token": "<|endoftext|>"})


#: name -> (how to make it, the ``pre`` it is written with; None for SentencePiece)
MADE = {
    "gpt2-124m": (_gpt2, "gpt-2"),
    "subword-bpe": (_subword, "gpt-2"),
    "smollm2": (_smollm2, "smollm"),
    "qwen2.5": (_qwen("Qwen/Qwen2.5-0.5B-Instruct"), "qwen2"),
    "qwen3": (_qwen("Qwen/Qwen3-0.6B"), "qwen2"),
    "olmo-2": (_olmo2, "dbrx"),
    "llama-3": (_llama3, "llama-bpe"),
    "stablelm2": (_stablelm2, "stablelm2"),
    "pythia": (_pythia, "olmo"),
    "tinyllama": (_tinyllama, None),
    "gemma": (_gemma, None),
    "phi-3": (_phi3, None),
}


def write_gguf(path: Path, tokenizer: Any, *, name: str | None = None) -> dict[str, Any]:
    """``tokenizer`` written with ``add_vocab`` into a GGUF file at ``path``: its metadata,
    as zoo's header reader reads it."""
    writer = gguf.GGUFWriter(str(path), "llama")
    if name is not None:
        writer.add_name(name)
    add_vocab(writer, tokenizer, where=str(path))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return dict(read_header(path).metadata)


@pytest.fixture(scope="module")
def made(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[Any, dict[str, Any], Any]]:
    """name -> (original tokenizer, the GGUF's metadata, the tokenizer read back)."""
    out = {}
    for name, (make, _) in MADE.items():
        folder = tmp_path_factory.mktemp(name)
        original = make(folder)
        meta = write_gguf(
            folder / "vocab.gguf", original, name="Phi-3 mini" if name == "phi-3" else None
        )
        out[name] = (original, meta, tokenizer_from_metadata(meta, where=name))
    return out


# -- round trips -------------------------------------------------------------------------


def _texts(tokenizer: Any) -> list[str]:
    specials = " ".join(tokenizer.special_tokens)
    added = [
        t
        for t in ("<tool_call>", "<think>", "|||EMAIL_ADDRESS|||")
        if tokenizer.token_to_id(t) is not None
    ]
    return [
        *HELD_OUT,
        specials,
        f"x{specials}y",
        f" {' '.join(added)} mid{''.join(added)}end ",
        specials.replace(" ", "\n "),
    ]


@pytest.mark.parametrize("name", list(MADE))
def test_the_ids_come_back(made: dict[str, Any], name: str) -> None:
    original, meta, back = made[name]
    assert meta[K + "model"] == ("llama" if MADE[name][1] is None else "gpt2")
    assert meta.get(K + "pre") == MADE[name][1]
    for text in _texts(original):
        for options in ({}, {"allowed_special": "all"}, {"add_special_tokens": True}):
            ids = original.encode(text, **options)
            assert back.encode(text, **options) == ids, (text, options)
            assert back.decode(ids) == original.decode(ids), text
            assert back.decode(ids, skip_special_tokens=True) == original.decode(
                ids, skip_special_tokens=True
            )
        assert back.decode(back.encode(text)) == original.decode(original.encode(text))


@pytest.mark.parametrize("name", list(MADE))
def test_special_tokens_and_chat_come_back(made: dict[str, Any], name: str) -> None:
    original, meta, back = made[name]
    assert back.vocab_size == original.vocab_size == len(meta[K + "tokens"])
    assert back.roles == original.roles
    for role in ("bos", "eos", "pad", "unk", "sep"):
        assert getattr(back, f"{role}_id") == getattr(original, f"{role}_id"), role
    assert back.special_tokens == original.special_tokens
    assert back._wrap == original._wrap
    assert back.eos_id == back.end_ids[0] and set(original.end_ids) <= set(back.end_ids)
    assert back.chat_template == original.chat_template
    if original.chat_template is not None:
        for tokenize in (False, True):
            kwargs: dict[str, Any] = {"add_generation_prompt": True, "tokenize": tokenize}
            assert back.apply_chat_template(CONVERSATION, **kwargs) == original.apply_chat_template(
                CONVERSATION, **kwargs
            )


def test_what_is_written_is_what_llama_cpp_reads(made: dict[str, Any]) -> None:
    types = {
        name: dict(zip(meta[K + "tokens"], meta[K + "token_type"], strict=True))
        for name, (_, meta, _) in made.items()
    }
    assert types["qwen2.5"]["<|im_end|>"] == 3 and types["qwen2.5"]["<tool_call>"] == 4
    assert (
        types["tinyllama"]["<unk>"] == 2
        and types["tinyllama"]["<s>"] == 3
        and types["tinyllama"]["<0x0A>"] == 6
    )
    assert types["pythia"][" " * 8] == 4 and types["gpt2-124m"]["<|endoftext|>"] == 3
    tiny, gemma, gpt2 = made["tinyllama"][1], made["gemma"][1], made["gpt2-124m"][1]
    assert tiny[K + "add_space_prefix"] is True and gemma[K + "add_space_prefix"] is False
    assert (
        tiny[K + "add_bos_token"] is True
        and tiny[K + "bos_token_id"] == 1
        and K + "merges" not in tiny
    )
    assert (
        K + "scores" not in gpt2
        and gpt2[K + "merges"][0] == "Ġ t"
        and gpt2[K + "eos_token_id"] == 50256
    )
    assert made["phi-3"][1][K + "eot_token_id"] == made["phi-3"][0].token_to_id("<|assistant|>")
    assert made["qwen2.5"][1]["tokenizer.chat_template"] == made["qwen2.5"][0].chat_template


def llama_cpp_spm(meta: dict[str, Any], text: str) -> list[int]:
    """llama.cpp's SentencePiece (``llm_tokenizer_spm_session``) on text with no added
    tokens: characters joined pair by pair, the adjacent pair whose join is the best-scored
    token first (the leftmost among equals), characters left over as bytes."""
    tokens, scores = meta[K + "tokens"], meta[K + "scores"]
    index = {t: i for i, t in enumerate(tokens)}
    symbols = list(("▁" if meta.get(K + "add_space_prefix", True) else "") + text.replace(" ", "▁"))
    while True:
        joins = [
            (-scores[index[a + b]], i)
            for i, (a, b) in enumerate(itertools.pairwise(symbols))
            if a + b in index
        ]
        if not joins:
            break
        i = min(joins)[1]
        symbols[i : i + 2] = [symbols[i] + symbols[i + 1]]
    return [
        j
        for s in symbols
        for j in ([index[s]] if s in index else [index[f"<0x{b:02X}>"] for b in s.encode()])
    ]


@pytest.mark.parametrize("name", ["tinyllama", "gemma", "phi-3"])
def test_llama_cpp_merges_as_the_tokenizer_does(made: dict[str, Any], name: str) -> None:
    original, meta, _ = made[name]
    for text in HELD_OUT + LINES[-40:]:
        if text:
            assert llama_cpp_spm(meta, text) == original.encode(text), text


def test_phi3_strips_the_space_after_its_tokens(made: dict[str, Any], tmp_path: Path) -> None:
    original, _, back = made["phi-3"]
    text = "<|user|>\nHi<|end|>\n<|assistant|>\n"
    assert back.encode(text, allowed_special="all") == original.encode(text, allowed_special="all")
    assert original.token_to_id("<0x0A>") not in original.encode(text, allowed_special="all")
    with pytest.raises(zoo.CheckpointError, match=r"general\.name"):
        write_gguf(tmp_path / "x.gguf", original)


def test_named_templates_come_back(made: dict[str, Any], tmp_path: Path) -> None:
    original = made["qwen2.5"][0]
    chat = ChatTemplate({"default": "{{ messages[0]['content'] }}", "tool_use": "{{ tools }}"})
    named = HFTokenizer(original.tokenizer, name="q", roles=original.roles, chat=chat)
    meta = write_gguf(tmp_path / "t.gguf", named)
    assert meta["tokenizer.chat_templates"] == ["tool_use"]
    assert tokenizer_from_metadata(meta, where="t").chat_template == chat.source


def test_default_pre_tokenizer_aliases_and_no_tokenizer(made: dict[str, Any]) -> None:
    assert tokenizer_from_metadata({"general.architecture": "llama"}, where="x") is None
    meta = dict(made["gpt2-124m"][1])
    for pre in ("default", None):  # llama.cpp's own split, also where the file names none
        meta.pop(K + "pre")
        meta |= {} if pre is None else {K + "pre": pre}
        library = tokenizer_from_metadata(meta, where="x").tokenizer
        words = [w for w, _ in library.pre_tokenizer.pre_tokenize_str("x 12345 a+b")]
        assert words == ["x", "Ġ", "123", "45", "Ġa", "+", "b"]
    aliases = [("pythia", "mpt"), ("llama-3", "llama3"), ("llama-3", "llama-v3")]
    for name, alias in [*aliases, ("gpt2-124m", "gpt2")]:
        original, meta, _ = made[name]
        back = tokenizer_from_metadata({**meta, K + "pre": alias}, where="x")
        assert [back.encode(t) for t in HELD_OUT] == [original.encode(t) for t in HELD_OUT]


# -- refusals ----------------------------------------------------------------------------


def _refused(tokenizer: Any, match: str, tmp_path: Path) -> None:
    writer = gguf.GGUFWriter(str(tmp_path / "r.gguf"), "llama")
    with pytest.raises(zoo.CheckpointError, match=match):
        add_vocab(writer, tokenizer, where="r.gguf")
    assert not any(k.startswith("tokenizer.") for k in writer.kv_data[0]), "wrote part of it"


def test_tokenizers_llama_cpp_cannot_hold_are_refused(made: dict[str, Any], tmp_path: Path) -> None:
    _refused(zoo.tokenizer("shakespeare-byte"), "no merges", tmp_path)
    _refused(zoo.tokenizer("wiki-gpt-wordpiece"), "WordPiece model", tmp_path)
    library = made["qwen2.5"][0].tokenizer
    _refused(
        HFTokenizer(library, name="c", roles={"eos": "<|im_end|>", "cls": "<|im_start|>"}),
        "cls",
        tmp_path,
    )
    _refused(HFTokenizer(library, name="n", roles={"pad": "<|im_end|>"}), "no eos token", tmp_path)
    _refused(
        HFTokenizer(
            library,
            name="w",
            roles={"eos": "<|im_end|>", "sep": "<|im_start|>"},
            wrap=("sep", None),
        ),
        "wraps",
        tmp_path,
    )
    moved = tokenizers.Tokenizer.from_str(library.to_str())
    moved.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=True)
    _refused(HFTokenizer(moved, name="p", roles={"eos": "<|im_end|>"}), "pre-tokenizer", tmp_path)
    moved.pre_tokenizer = library.pre_tokenizer
    moved.add_special_tokens([AddedToken("<|l|>", special=True, lstrip=True)])
    _refused(HFTokenizer(moved, name="l", roles={"eos": "<|im_end|>"}), "text around", tmp_path)


def test_sentencepiece_pipelines_llama_cpp_differs_from_are_refused(
    made: dict[str, Any], tmp_path: Path
) -> None:
    library = made["tinyllama"][0].tokenizer
    roles = {"bos": "<s>", "eos": "</s>", "unk": "<unk>"}
    metaspace = tokenizers.Tokenizer.from_str(library.to_str())
    metaspace.normalizer = None
    metaspace.pre_tokenizer = pre_tokenizers.Metaspace(prepend_scheme="first", split=False)
    _refused(HFTokenizer(metaspace, name="m", roles=roles), "normalizer", tmp_path)
    state = jsonfile.loads(library.to_str())
    state["model"]["merges"] = state["model"]["merges"][: len(state["model"]["merges"]) // 2]
    _refused(
        HFTokenizer(tokenizers.Tokenizer.from_str(json.dumps(state)), name="h", roles=roles),
        "no merge",
        tmp_path,
    )
    _refused(
        HFTokenizer(library, name="u", roles={"bos": "<s>", "eos": "</s>"}),
        "no unk token",
        tmp_path,
    )


#: Hostile metadata: each case changes the base metadata; the key its refusal must name.
HOSTILE = [
    ("model not a string", {K + "model": 7}, K + "model"),
    ("unknown model", {K + "model": "bert"}, K + "model"),
    ("no vocabulary model", {K + "model": "none"}, K + "model"),
    ("unknown pre", {K + "pre": "qwen99"}, K + "pre"),
    ("tokens not a list", {K + "tokens": "abc"}, K + "tokens"),
    ("a token not a string", {K + "tokens": ["a", 5]}, K + "tokens"),
    ("a token twice", {K + "tokens": "dup"}, K + "tokens"),
    ("an empty token", {K + "tokens": "empty"}, K + "tokens"),
    ("types of another length", {K + "token_type": [1]}, K + "token_type"),
    ("a type out of range", {K + "token_type": "nine"}, K + "token_type"),
    ("bos outside the vocabulary", {K + "bos_token_id": 10**6}, K + "bos_token_id"),
    ("eos negative", {K + "eos_token_id": -1}, K + "eos_token_id"),
    ("pad a string", {K + "padding_token_id": "0"}, K + "padding_token_id"),
    ("unk a boolean", {K + "unknown_token_id": True}, K + "unknown_token_id"),
    ("a merge of an unknown token", {K + "merges": ["Ġ zzzzqq"]}, K + "merges"),
    ("a merge without a space", {K + "merges": ["Ġt"]}, K + "merges"),
    ("merges not strings", {K + "merges": [1, 2]}, K + "merges"),
    ("a merge twice", {K + "merges": ["Ġ t", "Ġ t"]}, K + "merges"),
    ("no merges", {K + "merges": None}, K + "merges"),
    ("add_bos not a bool", {K + "add_bos_token": 1}, K + "add_bos_token"),
    (
        "add_bos without bos",
        {K + "add_bos_token": True, K + "bos_token_id": None},
        K + "add_bos_token",
    ),
    ("add_sep", {K + "add_sep_token": True}, K + "add_sep_token"),
    ("a template not a string", {"tokenizer.chat_template": ["x"]}, "tokenizer.chat_template"),
    (
        "a named template missing",
        {"tokenizer.chat_templates": ["tool_use"]},
        "tokenizer.chat_templates",
    ),
    ("general.name not a string", {"general.name": 3}, "general.name"),
    ("llama scores missing", {K + "model": "llama", K + "scores": None}, K + "scores"),
    ("llama scores not numbers", {K + "model": "llama", K + "scores": "str"}, K + "scores"),
    ("llama scores not finite", {K + "model": "llama", K + "scores": "nan"}, K + "scores"),
    ("llama without byte tokens", {K + "model": "llama", K + "scores": "zero"}, K + "tokens"),
]

CHILD = r"""
import sys
from zoo import jsonfile
from zoo.errors import CheckpointError
from zoo.checkpoint.gguf.vocab import tokenizer_from_metadata
for name, key, meta in jsonfile.loads(open(sys.argv[1], encoding="utf-8").read()):
    try:
        tokenizer_from_metadata(meta, where="hostile.gguf")
    except CheckpointError as exc:
        print("refused", name, "|", key in str(exc), "|", str(exc)[:300], flush=True)
    else:
        print("accepted", name, "|", key is None, "|", flush=True)
"""


def _hostile(base: dict[str, Any], change: dict[str, Any]) -> dict[str, Any]:
    """``base`` changed: ``None`` drops a key; a few names stand for values made from it."""
    tokens, n = base[K + "tokens"], len(base[K + "tokens"])
    made = {
        "dup": [*tokens[:-1], tokens[0]],
        "empty": ["", *tokens[1:]],
        "nine": [*[1] * (n - 1), 9],
        "str": ["x"] * n,
        "nan": [float("nan")] * n,
        "zero": [0.0] * n,
    }
    meta = dict(base)
    for key, value in change.items():
        if value is None:
            meta.pop(key, None)
        else:
            meta[key] = made[value] if isinstance(value, str) and value in made else value
    return meta


def test_hostile_metadata_is_refused_naming_the_key(made: dict[str, Any], tmp_path: Path) -> None:
    tokens = [*made["gpt2-124m"][1][K + "tokens"][:256], "Ġt", "<|endoftext|>"]
    base = {
        K + "model": "gpt2",
        K + "pre": "gpt-2",
        K + "tokens": tokens,
        K + "token_type": [*[1] * 257, 3],
        K + "merges": ["Ġ t"],
        K + "eos_token_id": 257,
        K + "bos_token_id": 257,
        "general.name": "x",
    }
    assert tokenizer_from_metadata(base, where="base").encode(" t") == [256]
    cases = [[name, key, _hostile(base, change)] for name, change, key in HOSTILE]
    spm = made["tinyllama"][1]  # a SentencePiece vocabulary with a token of 2 M characters
    long = {**spm, K + "tokens": [*spm[K + "tokens"], "▁" * 2_000_000]}
    long |= {K + "scores": [*spm[K + "scores"], 0.0], K + "token_type": [*spm[K + "token_type"], 1]}
    cases.append(["a token of 2 M characters, read in bounded time", None, long])
    (tmp_path / "cases.json").write_text(json.dumps(cases))
    run = subprocess.run(
        [sys.executable, "-c", CHILD, str(tmp_path / "cases.json")],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "TOKENIZERS_PARALLELISM": "false"},
    )
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-4000:]
    lines = run.stdout.splitlines()
    assert len(lines) == len(cases), run.stdout
    for (name, key, _), line in zip(cases, lines, strict=True):
        verdict = "refused" if key else "accepted"
        assert line.startswith(f"{verdict} {name} | True |"), (key, line)
