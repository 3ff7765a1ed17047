"""First contact with the command line: errors before output, suggestions for misspellings,
one set of generation defaults, `zoo classify`, `zoo info` on any source, a light `zoo tour`."""

from __future__ import annotations

import re
import subprocess
import sys

import pytest
import torch

import zoo
from zoo.cli import main
from zoo.options import GENERATION_DEFAULTS, QUANTIZE_MODES

TINY = {"n_layers": 1, "d_model": 32, "n_heads": 2, "d_ff": 64, "context_length": 32}


def run(capsys, *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def parse_error(capsys, *argv: str) -> str:
    with pytest.raises(SystemExit) as exc:
        main(list(argv))
    assert exc.value.code == 2
    return capsys.readouterr().err


@pytest.fixture(scope="module")
def classifier_dir(tmp_path_factory):
    """A tiny two-label classifier saved as `zoo train --task classify` saves one."""
    from zoo.train import classifier

    torch.manual_seed(0)
    body = zoo.build("gpt2-124m", **TINY, vocab_size=257)
    model = classifier(body, ["neg", "pos"])
    model.tokenizer = zoo.tokenizer("byte")
    return zoo.save(model, tmp_path_factory.mktemp("clf") / "model")


# -- 1. refuse before echoing -------------------------------------------------------------------
def test_generate_on_the_meta_device_is_refused_before_the_prompt_is_echoed(capsys):
    code, out, err = run(
        capsys, "generate", "shakespeare-byte", "ROMEO:", "--random", "--device", "meta"
    )
    assert code == 2 and out == ""
    assert "meta device" in err and "'cpu'" in err and "Traceback" not in err


def test_zoo_generate_refuses_a_model_on_meta_in_python():
    model = zoo.build("gpt2-124m", **TINY, vocab_size=257, device="meta")
    with pytest.raises(ValueError, match="meta device"):
        zoo.generate(model, [1, 2, 3], max_new_tokens=2)


@pytest.mark.parametrize("seed", [str(2**70), str(2**64), str(-(2**63) - 1)])
def test_a_seed_out_of_range_names_the_range(capsys, seed):
    code, out, err = run(
        capsys, "generate", "shakespeare-byte", "ROMEO:", "--random", "--seed", seed
    )
    assert code == 2 and out == ""
    assert "0 to 2**64 - 1 (18446744073709551615)" in err and seed in err


def test_seeds_at_the_ends_of_the_range_are_taken():
    model = zoo.build("gpt2-124m", **TINY, vocab_size=257)
    for seed in (0, 2**64 - 1, -1, -(2**63)):
        zoo.generate(model, [1, 2], max_new_tokens=2, seed=seed)
    with pytest.raises(ValueError, match=r"an integer of 5001 bits"):
        zoo.generate(model, [1, 2], max_new_tokens=2, seed=2**5000)


# -- 2. a classifier does not generate ------------------------------------------------------------
def test_generate_with_a_classifier_says_what_it_is_and_what_to_use(capsys, classifier_dir):
    code, out, err = run(capsys, "generate", str(classifier_dir), "a quick fox")
    assert code == 2 and out == ""
    assert "sequence classifier" in err and "neg, pos" in err and "zoo classify" in err
    model = zoo.load(classifier_dir)
    with pytest.raises(ValueError, match="sequence classifier"):
        zoo.generate(model, "a quick fox", stream=True)  # refused when called, not when read


# -- 3. zoo classify -------------------------------------------------------------------------------
def test_zoo_classify_prints_label_and_probability_per_text(capsys, classifier_dir):
    texts = ["a quick fox", "a lazy dog", "é"]
    code, out, err = run(capsys, "classify", str(classifier_dir), *texts)
    assert code == 0, err
    model = zoo.load(classifier_dir)
    lines = out.splitlines()
    assert len(lines) == 3
    for line, text in zip(lines, texts, strict=True):
        label, prob, shown = line.split("\t")
        with torch.no_grad():
            probs = model(torch.tensor([model.tokenizer.encode(text)])).softmax(-1)[0]
        assert shown == text and label == model.config.labels[int(probs.argmax())]
        assert float(prob) == pytest.approx(float(probs.max()), abs=1e-4)


def test_zoo_classify_refuses_a_language_model(capsys):
    code, out, err = run(capsys, "classify", "shakespeare-byte", "ROMEO:")
    assert code == 2 and out == ""
    assert "not a sequence classifier" in err and "zoo generate" in err


# -- 5. misspellings ------------------------------------------------------------------------------
def test_an_unknown_option_gets_the_commands_usage_and_a_suggestion(capsys):
    err = parse_error(capsys, "generate", "shakespeare-byte", "hi", "--max-tokens", "10")
    assert "usage: zoo generate" in err
    assert "unrecognized arguments: --max-tokens 10 (did you mean --max-new-tokens?)" in err


def test_a_misspelled_command_gets_a_suggestion(capsys):
    err = parse_error(capsys, "generat", "shakespeare-byte", "hi")
    assert "invalid choice: 'generat' (did you mean generate?)" in err


# -- 6. quantization modes ------------------------------------------------------------------------
def test_quantize_offers_every_mode_zoo_load_accepts(capsys):
    from zoo.quant.layers import QUANTIZE_MODES as used_by_load

    assert used_by_load is QUANTIZE_MODES == ("int8", "int8-weight", "int4")
    with pytest.raises(SystemExit):
        main(["generate", "--help"])
    help_text = " ".join(capsys.readouterr().out.split())
    assert "{int8,int8-weight,int4}" in help_text
    assert "int8-weight: weight-only int8" in help_text and "int8 activations" in help_text
    err = parse_error(capsys, "generate", "x", "y", "--quantize", "int9")
    assert "did you mean int8?" in err


# -- 8. one set of defaults -----------------------------------------------------------------------
def test_the_cli_and_zoo_generate_share_their_defaults(capsys):
    code, out, err = run(capsys, "generate", "shakespeare-byte", "ROMEO:", "--seed", "0")
    assert code == 0, err
    model = zoo.load("shakespeare-byte")
    assert out == "ROMEO:" + zoo.generate(model, "ROMEO:", seed=0) + "\n"
    assert GENERATION_DEFAULTS.max_new_tokens == 50 and GENERATION_DEFAULTS.temperature == 1.0


# -- 4. zoo info on any source zoo.load accepts ----------------------------------------------
def test_info_describes_a_checkpoint_folder_from_its_config_alone(capsys, classifier_dir, tmp_path):
    folder = tmp_path / "ckpt"
    folder.mkdir()
    (folder / "config.json").write_bytes((classifier_dir / "config.json").read_bytes())
    (folder / "model.safetensors").write_bytes(b"not weights")  # info never reads them
    code, out, err = run(capsys, "info", str(folder))
    assert code == 0, err
    assert "sequence-classifier" in out and "labels = ['neg', 'pos']" in out
    assert f"{folder / 'model.safetensors'}" in out and "tokenizer     byte" in out
    assert f"{zoo.load(classifier_dir).num_parameters():,}" in out


def test_info_describes_a_hugging_face_folder_and_refuses_a_missing_one(capsys, tmp_path):
    torch.manual_seed(0)
    model = zoo.build("gpt2-124m", **TINY, vocab_size=257)
    folder = zoo.export(model, tmp_path / "hf", "hf-gpt2")
    code, out, err = run(capsys, "info", str(folder))
    assert code == 0, err
    assert "hf-gpt2 checkpoint of gpt2" in out and f"{model.num_parameters():,}" in out
    code, out, err = run(capsys, "info", str(tmp_path / "absent"))
    assert code == 2 and "does not exist" in err


def test_info_describes_a_hub_repo(capsys, classifier_dir, local_hub):
    zoo.push(zoo.load(classifier_dir), "org/clf")
    code, out, err = run(capsys, "info", "hf:org/clf")
    assert code == 0, err
    assert out.startswith("hf:org/clf: a zoo checkpoint of sequence-classifier")
    assert "labels = ['neg', 'pos']" in out


# -- 7. only the fields that take effect ---------------------------------------------------------
def test_info_shows_only_the_config_fields_that_take_effect(capsys):
    code, out, _ = run(capsys, "info", "tinyllama-1.1b")
    assert code == 0 and "ffn = 'swiglu'" in out and "activation" not in out
    assert "rope_theta" in out
    code, out, _ = run(capsys, "info", "gpt2-124m")
    assert code == 0 and "activation = 'gelu_tanh'" in out
    assert "rope_theta" not in out and "rotary_dim" not in out


def test_inert_fields_follow_what_components_declare(use_registry):
    from tests.test_components import _identity, _Supplies, _use
    from zoo.api import inert_fields, resolve_config
    from zoo.plugin.specs import ComponentSpec

    def config(**overrides):
        return resolve_config("gpt2-124m", n_layers=1, **overrides)[2]

    assert inert_fields(config(ffn="geglu")) == {"rope_theta", "rotary_dim", "rope_local_theta"}
    assert "activation" in inert_fields(config(ffn="swiglu"))
    supplies = _Supplies(
        ComponentSpec("ffn", "undeclared", _identity),  # reads=None: may read anything
        ComponentSpec("ffn", "own-act", _identity, reads=("act_scale",)),
    )
    _use(use_registry, plugins={"supplies": supplies})
    assert "activation" not in inert_fields(config(ffn="undeclared"))
    assert "activation" in inert_fields(config(ffn="own-act"))
    with pytest.raises(ValueError, match="reads must be a tuple"):
        ComponentSpec("ffn", "bad", _identity, reads=["activation"])  # type: ignore[arg-type]


# -- 9. a light tour ------------------------------------------------------------------------------
TOUR_PEAK = """
import resource, subprocess, sys
out = subprocess.run([sys.executable, "-m", "zoo.cli", "tour"], capture_output=True, text=True)
peak = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss  # KiB on Linux
print(out.returncode, peak)
sys.stdout.write(out.stdout)
sys.stderr.write(out.stderr)
"""


@pytest.mark.slow
def test_the_tour_fits_in_one_gigabyte_and_shows_large_models_on_meta():
    proc = subprocess.run([sys.executable, "-c", TOUR_PEAK], capture_output=True, text=True)
    code, peak_kib = map(int, proc.stdout.splitlines()[0].split())
    assert code == 0, proc.stderr
    assert peak_kib < 1024 * 1024, f"zoo tour peaked at {peak_kib / 1024:.0f} MiB"
    tour = proc.stdout
    assert "tinyllama-1.1b" in tour and "logits 1x16x32000 (shapes only)" in tour
    assert "parameters    1,100,048,384" in tour and "--max-mib 4197" in tour
    assert "gpt2-124m" in tour and "logits 1x16x50257\n" in tour  # built for real
    # the closing line says how many were built with weights and which went to the meta device
    summary = re.fullmatch(
        r"(\d+) of (\d+) named models built on cpu; (\d+) over --max-mib 512 of float32 "
        r"weights built on the meta device \(shapes only\): (.*)",
        tour.rstrip().splitlines()[-1],
    )
    assert summary, tour[-400:]
    built, total, n_meta = map(int, summary.groups()[:3])
    meta = summary.group(4).split(", ")
    headers = [line.split(":")[0] for line in tour.splitlines() if re.match(r"[\w.-]+: ", line)]
    assert (built + n_meta, n_meta) == (total, len(meta)) and total == len(headers)
    assert {"smollm2-135m-instruct", "tinyllama-1.1b"} <= set(meta) and "gpt2-124m" not in meta


def test_info_describes_the_blocks_as_the_config_makes_them(capsys, tmp_path):
    """A post-LN gpt2 checkpoint is not described as "pre-LN" (the architecture's default)."""
    from zoo.cli import main

    zoo.save(zoo.build("gpt2-124m", n_layers=2, norm_first=False, final_norm=False), tmp_path)
    assert main(["info", str(tmp_path)]) == 0
    out = capsys.readouterr().out.splitlines()
    blocks = next(line for line in out if line.strip().startswith("blocks"))
    assert "2 blocks (post-LN, norm(x + f(x)))" in blocks and "final norm" not in blocks
