"""The README's translation and summary run as written, against a local Hub, and print what
transformers generates from the same files.

The Quickstart's ``zoo generate NAME "text" --num-beams 4`` lines of the named
encoder-decoders (``opus-mt-en-de``, ``flan-t5-small``) are read from README.md and run as
processes, each against a local Hub (``zoo.localhub``) that serves, under the named model's
repo, random weights of its real configuration (the vendored ``config.json``) and a tokenizer
of the real one's shape, trained here (the Hub is not reachable from the tests; the registry's
pins are dropped for the local Hub's commit, chosen with ``ZOO_PREFER`` as a user would). Only
``--max-new-tokens`` is cut. Each command must exit 0 and print transformers' ``generate``
(the same beams and tokens, the folder's ``generation_config.json``) of the same files,
decoded without special tokens. The Python form of the translation in docs/generation.md is
run the same way.

The tokenizers (``tests/spm_vocab.py``): OPUS-MT en-de's SentencePiece pair and ``vocab.json``
(``</s>`` 0, ``<unk>`` 1, ``<pad>`` 58100), Flan-T5's ``tokenizer.json`` (32,000 pieces, then
100 sentinels), each a model trained on tinyshakespeare and grown to the real size with pieces
named after their ids (``w123``), so the printed text shows the ids generated. The weights are
drawn so that a beam search does not repeat one token (see :func:`lively`).
"""

from __future__ import annotations

import ast
import json
import re
import shlex
import shutil
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import google.protobuf  # noqa: F401  (transformers reads spiece.model through it)
import pytest
import safetensors.torch
import torch
import transformers
from docblocks import README, ROOT, all_commands, blocks
from hubserver import LocalHub
from spm_vocab import LINES, filler, grown_spm, marian_vocab, train_spm

import zoo

pytestmark = [
    pytest.mark.slow,  # full-size random models: about 300 MB of weights each
    # transformers' MarianTokenizer asks for sacremoses, which it never uses to encode
    pytest.mark.filterwarnings("ignore:Recommended. pip install sacremoses"),
]

HUB_DATA = ROOT / "tests" / "data" / "hub"
DOC = ROOT / "docs" / "generation.md"

#: New tokens each command generates here (the README's own count, or none, is replaced).
NEW_TOKENS = 8

#: The ``zoo generate`` flags a README line may give -> ``generate``'s keyword in both.
FLAGS = {
    "--num-beams": ("num_beams", int),
    "--max-new-tokens": ("max_new_tokens", int),
    "--no-repeat-ngram-size": ("no_repeat_ngram_size", int),
    "--min-new-tokens": ("min_new_tokens", int),
    "--length-penalty": ("length_penalty", float),
}


def _named(name: str) -> Any:
    """The registry's named model ``name``, or None."""
    registry = zoo.get_registry()
    return registry.model(name) if name in registry.models() else None


def _is_encoder_decoder(name: str) -> bool:
    spec = _named(name)
    if spec is None or spec.weights is None:
        return False
    model_class = zoo.get_registry().architecture(spec.architecture).model_class
    return bool(getattr(model_class, "is_encoder_decoder", False))


def seq2seq_commands() -> list[str]:
    """The README's ``zoo generate`` commands of a named encoder-decoder with Hub weights."""
    found = []
    for command, _ in all_commands([README]):
        argv = shlex.split(command)
        if argv[:2] == ["zoo", "generate"] and _is_encoder_decoder(argv[2]):
            found.append(command)
    return found


COMMANDS = seq2seq_commands()


def test_the_readme_shows_a_translation_and_a_summary() -> None:
    """The lines this file runs are in the README, marked as needing the Hub (the README's
    own run leaves them out)."""
    names = [shlex.split(command)[2] for command in COMMANDS]
    assert "opus-mt-en-de" in names and "flan-t5-small" in names, names
    marked = {c: comment for c, comment in all_commands([README]) if c in COMMANDS}
    assert all("needs the Hub" in comment for comment in marked.values()), marked


# -- the repos: real configs, random weights, tokenizers of the real shape ---------------------
def lively(model: torch.nn.Module, std: float = 0.05, seed: int = 0, **stds: float) -> None:
    """Every weight matrix of a transformers model drawn from N(0, std), those whose name holds
    a key of ``stds`` from N(0, that); norms 1, biases 0. A full-size random Marian's
    cross-attention, as strong as the rest, gives every target position the same average of
    the source, and a beam search repeats one token: Marian's is drawn small, its embeddings
    wider, so each step's own tokens steer it."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if not p.requires_grad:  # Marian's fixed sinusoidal table
                continue
            if p.ndim < 2:
                p.fill_(1.0 if "norm" in name and name.endswith("weight") else 0.0)
                continue
            scale = next((v for k, v in stds.items() if k in name), std)
            p.copy_(torch.randn(p.shape, generator=g) * scale)
        inner = getattr(model, "model", None)
        if inner is not None and hasattr(inner, "shared"):  # one vocabulary, as OPUS-MT's
            for stack in (inner.encoder, inner.decoder):
                stack.embed_tokens.weight.copy_(inner.shared.weight)


def _weights(repo: str, folder: Path, **draw: float) -> dict[str, Any]:
    """Random weights of ``repo``'s vendored config.json saved by transformers into ``folder``,
    the vendored files put back in place of the ones it rewrites; the config read."""
    config = transformers.AutoConfig.from_pretrained(HUB_DATA / repo)
    torch.manual_seed(0)
    model = transformers.AutoModelForSeq2SeqLM.from_config(config).eval()
    lively(model, **draw)
    model.save_pretrained(folder)
    for vendored in (HUB_DATA / repo).iterdir():
        shutil.copy(vendored, folder / vendored.name)
    raw = json.loads((HUB_DATA / repo / "config.json").read_text())
    if raw.get("tie_word_embeddings") is False:  # a head of its own (Flan-T5's)
        _own_head(folder / "model.safetensors", draw.get("std", 0.05))
    return raw


def _own_head(weights: Path, std: float) -> None:
    """The head a checkpoint with ``tie_word_embeddings: false`` has, drawn and added to its
    weights: transformers 5 ties T5's head to the embedding whatever config.json says (a
    ``T5Config`` sets ``tie_word_embeddings`` to True after reading it) and saves none."""
    state = safetensors.torch.load_file(weights)
    assert "lm_head.weight" not in state, "transformers saved a head: this is not needed"
    g = torch.Generator().manual_seed(1)
    state["lm_head.weight"] = torch.randn(state["shared.weight"].shape, generator=g) * std
    safetensors.torch.save_file(state, weights, metadata={"format": "pt"})


def opus_mt_repo(folder: Path, work: Path) -> None:
    """Helsinki-NLP/opus-mt-en-de's files: config.json (vendored), a generation_config.json
    of its generation values (the pad id as a bad word, max_length 512) and 4 beams, as the
    repo's later revisions carry one, and the SentencePiece pair with one vocab.json of
    58,101 tokens (the target's model grown with the pieces the vocabulary is filled with)."""
    config = _weights("Helsinki-NLP/opus-mt-en-de", folder, encoder_attn=0.01, shared=0.1,
                      embed_tokens=0.1)  # fmt: skip
    pad = config["pad_token_id"]
    keys = ("bad_words_ids", "bos_token_id", "decoder_start_token_id", "eos_token_id",
            "max_length", "pad_token_id")  # fmt: skip
    generation = {key: config[key] for key in keys}
    generation |= {"forced_eos_token_id": config["eos_token_id"], "num_beams": 4}
    (folder / "generation_config.json").write_text(json.dumps(generation, indent=2))
    source = train_spm(LINES[:1500], work / "source", 800)
    target = train_spm(LINES[1500:3000], work / "target", 800)
    vocab = marian_vocab([source, target], codes=(), size=config["vocab_size"])
    assert (vocab["</s>"], vocab["<unk>"], vocab["<pad>"]) == (0, 1, pad) == (0, 1, 58100)
    fillers = [piece for piece, token_id in vocab.items() if piece == filler(token_id)]
    target = grown_spm(target, work / "target-grown.model", fillers)  # the target's words
    (work / "vocab.json").write_text(json.dumps(vocab))
    tokenizer = transformers.MarianTokenizer(
        str(source), str(target), str(work / "vocab.json"), source_lang="en", target_lang="de"
    )
    tokenizer.save_pretrained(folder)


def flan_t5_repo(folder: Path, work: Path) -> None:
    """google/flan-t5-small's files: config.json and generation_config.json (vendored) and a
    tokenizer.json of 32,100 tokens (SentencePiece's pad 0, eos 1, unk 2, then T5's 100
    sentinels) for the model's 32,128."""
    _weights("google/flan-t5-small", folder, std=0.03)
    trained = train_spm(LINES[:1500], work / "spiece", 800, pad_id=0, eos_id=1, unk_id=2,
                        bos_id=-1)  # fmt: skip
    spm = work / "spm"
    spm.mkdir()
    grown_spm(trained, spm / "spiece.model", [filler(i) for i in range(800, 32000)])
    tokenizer = transformers.T5Tokenizer.from_pretrained(spm)
    assert len(tokenizer) == 32100 and tokenizer.convert_ids_to_tokens(31999) == filler(31999)
    tokenizer.save_pretrained(folder)


#: Each named model's layout -> what writes its repo's files.
REPOS: dict[str, Callable[[Path, Path], None]] = {"hf-marian": opus_mt_repo, "hf-t5": flan_t5_repo}


@pytest.fixture(scope="module")
def repos(tmp_path_factory: pytest.TempPathFactory) -> Callable[[str], Path]:
    """Named model -> the folder of its repo's files, written once for the module."""
    made: dict[str, Path] = {}

    def repo(name: str) -> Path:
        if name not in made:
            layout = _named(name).weights.layout
            assert layout in REPOS, f"{name}: no stand-in repo for layout {layout}: add one"
            where = tmp_path_factory.mktemp(name)
            (where / "repo").mkdir()
            REPOS[layout](where / "repo", where)
            made[name] = where / "repo"
        return made[name]

    return repo


def _unpinned(name: str, where: Path) -> Path:
    """A registry file with registry.toml's section of ``name`` less its revision and sha256
    (the local Hub's commit is another)."""
    text = (ROOT / "registry.toml").read_text()
    start = text.index(f"[models.{name}]")
    after = re.search(rf"^\[models\.(?!{re.escape(name)}[.\]])", text[start:], flags=re.M)
    section = text[start : start + after.start()] if after else text[start:]
    section = re.sub(r"^(revision|sha256) = .*$", "", section, flags=re.M)
    assert "weights]" in section and "revision =" not in section and "sha256 =" not in section
    path = where / f"{name}.toml"
    path.write_text(section)
    return path


@pytest.fixture
def hub_for(
    local_hub: LocalHub,
    repos: Callable[[str], Path],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> Iterator[Callable[[str], Path]]:
    """Named model -> its repo's folder, after publishing it on the local Hub under the
    registry's repo id and preferring the registry file without its pins."""

    def publish(name: str) -> Path:
        folder = repos(name)
        files = {p.name: p for p in folder.iterdir()}
        local_hub.add_files(_named(name).weights.repo, files, message="seed")
        registry = _unpinned(name, tmp_path)
        monkeypatch.setenv("ZOO_REGISTRY_PATH", str(registry))
        monkeypatch.setenv("ZOO_PREFER", str(registry))
        zoo.reset_registry()
        return folder

    yield publish
    zoo.reset_registry()


# -- the reference: transformers on the same files ---------------------------------------------
def transformers_text(folder: Path, source: str, settings: dict[str, Any]) -> tuple[str, list]:
    """transformers' ``generate`` of ``source`` from ``folder`` (its generation_config.json
    under ``settings``), decoded without special tokens; and the ids."""
    tokenizer = transformers.AutoTokenizer.from_pretrained(folder)
    model = transformers.AutoModelForSeq2SeqLM.from_pretrained(folder).eval()
    head = safetensors.torch.load_file(folder / "model.safetensors").get("lm_head.weight")
    if head is not None and not torch.equal(head, model.lm_head.weight):
        # the file's own head, which transformers 5 ties to the embedding (see _own_head)
        model.lm_head.weight = torch.nn.Parameter(head)
    ids = model.generate(**tokenizer(source, return_tensors="pt"), **settings)[0]
    return tokenizer.decode(ids, skip_special_tokens=True), ids.tolist()


def _settings(flags: list[str]) -> dict[str, Any]:
    """A README line's flags as ``generate``'s keywords, ``max_new_tokens`` cut."""
    assert len(flags) % 2 == 0, flags
    settings = {}
    for flag, value in zip(flags[::2], flags[1::2], strict=True):
        assert flag in FLAGS, f"{flag}: this test does not know it yet (FLAGS)"
        keyword, kind = FLAGS[flag]
        settings[keyword] = kind(value)
    return settings | {"max_new_tokens": NEW_TOKENS}


def _assert_lively(ids: list[int]) -> None:
    """The reference is worth comparing with: several distinct tokens, not one repeated."""
    assert len(set(ids[1:])) >= 4, f"the random weights decode to one repeated token: {ids}"


@pytest.mark.parametrize("command", COMMANDS, ids=lambda c: shlex.split(c)[2])
def test_the_readme_line_prints_what_transformers_generates(
    command: str, hub_for: Callable[[str], Path], tmp_path: Path
) -> None:
    """The README's line, with fewer new tokens, prints transformers' text of the same repo."""
    argv = shlex.split(command)
    name, source, settings = argv[2], argv[3], _settings(argv[4:])
    folder = hub_for(name)
    want, ids = transformers_text(folder, source, settings)
    _assert_lively(ids)
    flags = [f for flag, value in zip(argv[4::2], argv[5::2], strict=True)
             if flag != "--max-new-tokens" for f in (flag, value)]  # fmt: skip
    run = subprocess.run(
        [sys.executable, "-m", "zoo.cli", "generate", name, source, *flags,
         "--max-new-tokens", str(NEW_TOKENS)],
        capture_output=True, text=True, timeout=600, cwd=tmp_path,
    )  # fmt: skip
    assert run.returncode == 0, run.stderr[-3000:]
    assert run.stdout == want + "\n", (run.stdout, want, ids)


# -- docs/generation.md's translation in Python --------------------------------------------------
class _FewTokens(ast.NodeTransformer):
    """``zoo.generate(...)`` calls given ``max_new_tokens=NEW_TOKENS``."""

    def visit_Call(self, node: ast.Call) -> ast.Call:
        self.generic_visit(node)
        if isinstance(node.func, ast.Attribute) and node.func.attr == "generate":
            node.keywords = [k for k in node.keywords if k.arg != "max_new_tokens"]
            node.keywords.append(ast.keyword("max_new_tokens", ast.Constant(NEW_TOKENS)))
        return node


def guide_translation() -> list[str]:
    """docs/generation.md's lines that load ``opus-mt-en-de`` and translate with it."""
    for block in blocks(DOC, "python"):
        lines = block.text.splitlines()
        loads = [i for i, line in enumerate(lines) if 'zoo.load("opus-mt-en-de")' in line]
        if loads:
            return lines[loads[0] : loads[0] + 2]
    raise AssertionError("docs/generation.md does not load opus-mt-en-de")


def test_the_guide_translates_as_transformers_does(hub_for: Callable[[str], Path]) -> None:
    """The guide's two lines, marked as needing the Hub, run here against the local Hub: the
    translation is transformers' (``max_new_tokens`` cut)."""
    load, translate = guide_translation()
    assert "needs the Hub" in load and "needs the Hub" in translate
    call = ast.parse(translate.partition("  #")[0].strip(), mode="eval")
    generate = call.body
    assert isinstance(generate, ast.Call) and isinstance(generate.args[1], ast.Constant)
    settings = {k.arg: ast.literal_eval(k.value) for k in generate.keywords}
    folder = hub_for("opus-mt-en-de")
    settings |= {"max_new_tokens": NEW_TOKENS}
    want, ids = transformers_text(folder, generate.args[1].value, settings)
    _assert_lively(ids)
    namespace: dict[str, Any] = {"zoo": zoo}
    exec(compile(load.partition("  #")[0].strip(), str(DOC), "exec"), namespace)
    fewer = ast.fix_missing_locations(_FewTokens().visit(call))
    assert eval(compile(fewer, str(DOC), "eval"), namespace) == want
