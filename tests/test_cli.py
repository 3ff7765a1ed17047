"""The ``zoo`` command line."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

import pytest

from zoo.cli import main


def run(capsys, *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_console_script_lists_without_torch():
    exe = shutil.which("zoo")
    assert exe, "the `zoo` console script is not installed"
    env = {**os.environ, "PYTHONPROFILEIMPORTTIME": "1"}  # every import, on stderr
    out = subprocess.run([exe, "list"], capture_output=True, text=True, check=True, env=env)
    assert "gpt2-124m" in out.stdout and "wiki-gpt-wordpiece" in out.stdout
    imported = {line.rsplit("|", 1)[-1].strip() for line in out.stderr.splitlines()}
    assert "zoo.plugin.current" in imported, "import profile not captured: the check proves nothing"
    assert "torch" not in imported


# `zoo plugins` imports every architecture (so that one whose module raises shows as
# failed): it is a diagnostic, not a listing command.
@pytest.mark.parametrize("argv", [["list"], ["--help"]])
def test_fast_commands_import_no_torch(argv):
    code = (
        "import sys\nfrom zoo.cli import main\n"
        f"try:\n    main({argv!r})\nexcept SystemExit:\n    pass\n"
        "assert 'torch' not in sys.modules, 'torch was imported'\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr


def test_list(capsys):
    code, out, _ = run(capsys, "list")
    assert code == 0
    for name in ("gpt1", "gpt2-124m", "wiki-gpt-wordpiece", "transformer-encdec", "toy-gpt-tiny"):
        assert name in out


def test_info(capsys):
    code, out, _ = run(capsys, "info", "gpt2")
    assert code == 0
    assert "gpt2-124m" in out and "124,439,808" in out and "plugin gpt2" in out
    assert "n_layers = 12" in out and "learned" in out and "tiktoken" in out


def test_plugins(capsys):
    code, out, _ = run(capsys, "plugins")
    assert code == 0
    assert "toy" in out and "zoo-toy 0.1" in out and "architectures: toy-gpt" in out


def test_check_runs_the_conformance_kit(capsys):
    """A check that cannot run is printed SKIPPED with its reason, never ok; the summary
    names each skip and why, and the exit code is 1 (a skip proved nothing) unless
    ``--allow-skip`` (the toy plugin's ``toy-alibi``: no layout holds ALiBi on GPT-2)."""
    code, out, _ = run(capsys, "check", "toy-alibi", "--device", "cpu")
    assert code == 1 and "meta" in out
    (line,) = [
        line for line in out.splitlines() if line.startswith("toy-alibi ") and " reference " in line
    ]
    assert " SKIPPED " in line and "cannot hold the small model" in line
    assert "all checks that ran passed, 2 skipped; a skipped check proved nothing" in out
    summary = out.split("a skipped check proved nothing")[1]
    assert "toy-alibi reference (cpu): hf-gpt2: the layout cannot hold" in summary
    assert "toy-alibi checkpoint_layouts (cpu): hf-gpt2 cannot hold the small model" in summary
    code, out, _ = run(capsys, "check", "toy-alibi", "--device", "cpu", "--allow-skip")
    assert code == 0 and "2 skipped (allowed by --allow-skip):" in out


def test_the_worked_example_plugin_passes_the_kit_with_no_skip(capsys):
    """docs/plugins.md's toy-gpt declares a layout and its own reference: every check runs."""
    code, out, _ = run(capsys, "check", "toy-gpt-tiny", "--device", "cpu")
    assert code == 0 and out.splitlines()[-1] == "all checks passed"
    (line,) = [line for line in out.splitlines() if " reference " in line]
    assert "zoo_toy.reference:load: max logit difference" in line and "6 heads" in line


def test_check_exits_0_when_every_check_ran_and_passed(capsys):
    code, out, _ = run(capsys, "check", "gpt2-124m", "--device", "cpu")
    assert code == 0 and out.splitlines()[-1] == "all checks passed"


def test_errors_are_one_line_without_traceback(capsys):
    code, out, err = run(capsys, "info", "gpt3")
    assert code == 2 and out == ""
    assert err.startswith("zoo: error: unknown model 'gpt3'") and err.count("\n") == 1
    assert "Traceback" not in err


def test_generate_streams_a_random_model_offline(capsys):
    code, out, _ = run(
        capsys,
        "generate",
        "gpt2-124m",
        "Every effort moves you",
        "--random",
        "--max-new-tokens",
        "5",
        "--seed",
        "0",
        "--dtype",
        "bfloat16",
    )
    assert code == 0 and out.startswith("Every effort moves you") and len(out) > 24


def test_generate_without_weights_is_one_clear_line(capsys):
    code, out, err = run(capsys, "generate", "wiki-gpt-wordpiece", "hello")
    assert code == 2 and out == "" and err.count("\n") == 1
    assert err.startswith("zoo: error: no local weights for 'wiki-gpt-wordpiece'")
    assert "$ZOO_WEIGHTS_DIR" in err


def test_convert_round_trip(capsys, tmp_path):
    import torch

    import zoo

    model = zoo.build("gpt2-124m", n_layers=1, d_model=64, n_heads=4, d_ff=128)
    zoo.save(model, tmp_path / "zoo")
    code, out, _ = run(
        capsys, "convert", str(tmp_path / "zoo"), str(tmp_path / "hf"), "--to", "hf-gpt2"
    )
    assert code == 0 and "hf-gpt2" in out
    code, _, _ = run(capsys, "convert", str(tmp_path / "hf"), str(tmp_path / "back"))
    assert code == 0
    back = zoo.load(tmp_path / "back")
    for key, tensor in model.state_dict().items():
        assert torch.equal(back.state_dict()[key], tensor)


COMMANDS = ["list", "info", "plugins", "check", "tour", "generate", "convert", "push", "pull"]


@pytest.mark.parametrize("command", [[], *[[c] for c in COMMANDS]])
def test_every_command_has_help(capsys, command):
    with pytest.raises(SystemExit) as exit_:
        main([*command, "--help"])
    assert exit_.value.code == 0
    assert "usage: zoo" in capsys.readouterr().out


# -- conflicts and broken plugins are loud, never fatal ---------------------------------------
class _Shadow:
    """A plugin that also registers the built-in gpt2-124m."""

    import zoo as _zoo

    @_zoo.hookimpl
    def zoo_models(self):
        import zoo

        return [zoo.ModelSpec(name="gpt2-124m", architecture="gpt2", config={"n_layers": 2})]


def test_list_and_plugins_show_a_conflict(capsys, monkeypatch, use_registry):
    import zoo.plugin.current

    use_registry(zoo.plugin.current.load_registry(plugins={"dup": _Shadow()}))
    code, out, err = run(capsys, "list")
    assert code == 0
    row = next(line for line in out.splitlines() if line.startswith("gpt2-124m"))
    assert "conflict: registry.toml vs plugin dup" in row
    assert "ZOO_PREFER" in err and "'gpt2-124m'" in err
    code, out, _ = run(capsys, "plugins")
    dup = next(line for line in out.splitlines() if line.startswith("dup "))
    assert "conflict" in dup and "model gpt2-124m" in dup
    assert "conflict: model name 'gpt2-124m' is claimed by" in out


def test_a_plugin_calling_sys_exit_at_import_is_isolated(tmp_path):
    from conftest import install_distribution

    package = tmp_path / "src" / "zoo_exits"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text("import sys\nsys.exit(3)\n")
    site = tmp_path / "site"
    site.mkdir()
    install_distribution(site, package, name="zoo-exits", entry_points="[zoo]\nexits = zoo_exits\n")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(site), *sys.path])}
    code = "from zoo.cli import main; raise SystemExit(main(['plugins']))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env)
    assert out.returncode == 0, out.stderr
    line = next(line for line in out.stdout.splitlines() if line.startswith("exits"))
    assert "failed" in line and "SystemExit: 3" in line


def test_tour_streams_each_model_with_its_blocks(capsys, monkeypatch):
    """Each model's description is printed as soon as it is built and run (not at the end)."""
    import zoo.api

    names = ["toy-gpt-tiny", "transformer-encdec-tiny"]
    monkeypatch.setattr(zoo.api, "list_models", lambda: names)
    real_build = zoo.api.build
    seen_before_build: list[str] = []

    def build(name, **kwargs):
        if kwargs.get("device") != "meta":  # zoo.info counts parameters on meta
            seen_before_build.append(capsys.readouterr().out)
        return real_build(name, **kwargs)

    monkeypatch.setattr(zoo.api, "build", build)
    assert main(["tour"]) == 0
    rest = capsys.readouterr().out
    assert seen_before_build[0] == ""
    first = seen_before_build[1]  # printed before the second model was even built
    assert first.startswith("toy-gpt-tiny:") and "2 blocks (pre-LN" in first
    assert "transformer-encdec-tiny:" in rest and "blocks" in rest and "cross-attention" in rest


def test_generate_with_random_weights_is_reproducible_with_a_seed(capsys):
    """On shakespeare-byte (2.7 M parameters; gpt2-124m's random build took 4 s a run, and
    it proves no more): its shipped weights give other text, so --random was not ignored."""
    argv = ["generate", "shakespeare-byte", "Hello", "--random", "--max-new-tokens", "4"]
    outputs = {run(capsys, *argv, "--seed", "3")[1] for _ in range(2)}
    assert len(outputs) == 1
    assert run(capsys, *argv, "--seed", "4")[1] not in outputs  # another seed, other weights
    shipped = [arg for arg in argv if arg != "--random"]
    assert run(capsys, *shipped, "--seed", "3")[1] not in outputs  # random weights, not these


def test_an_error_is_printed_on_its_own_line(capsys):
    """The encoder-decoder has no tokenizer here: the error is a line of its own on stderr,
    never run together with the echoed prompt ("Hello therezoo: error: ...")."""
    code, out, err = run(capsys, "generate", "transformer-encdec", "Hello there", "--random")
    assert code == 2 and err.startswith("zoo: error: ") and err.count("\n") == 1
    assert out == "" or out.endswith("\n")


@pytest.mark.parametrize(
    ("device", "message"),
    [("nope", "is not a torch device"), ("cuda:7", "CUDA device")],
)
def test_a_bad_device_is_one_clear_line(capsys, device, message):
    code, out, err = run(capsys, "generate", "gpt2-124m", "Hi", "--random", "--device", device)
    assert code == 2 and message in err and err.count("\n") == 1 and out == ""


def test_push_of_a_missing_directory_says_it_does_not_exist(capsys, tmp_path):
    code, _, err = run(capsys, "push", str(tmp_path / "missing-dir"), "org/x")
    assert code == 2 and "missing-dir does not exist" in err


def test_plugins_names_the_preferred_source_and_what_it_beat(capsys, monkeypatch, use_registry):
    import zoo.plugin.current

    registry = zoo.plugin.current.load_registry(plugins={"dup": _Shadow()}, prefer=["dup"])
    use_registry(registry)
    code, out, _ = run(capsys, "plugins")
    assert code == 0
    assert "preferred: model gpt2-124m from plugin dup (ZOO_PREFER), over registry.toml\n" in out


def test_a_prompt_that_is_not_utf8_is_one_clear_line(capsys):
    """Python hands undecodable argv bytes over as lone surrogates (surrogateescape)."""
    code, out, err = run(capsys, "generate", "gpt2-124m", "Hello \udcff", "--random")
    assert code == 2 and out == "" and err.count("\n") == 1
    assert "the prompt is not valid UTF-8: byte 0xff at character 6" in err


def test_an_error_while_streaming_starts_its_own_line(capsys, monkeypatch):
    """An id the tokenizer cannot decode (nanoGPT's padded vocabulary used to give one) fails
    mid-stream: the echoed prompt and continuation end their line first."""
    import torch

    import zoo.generation.sampling

    real = zoo.generation.sampling.next_tokens
    calls = []

    def bad_after_two(logits, **kwargs):
        calls.append(1)
        token = real(logits, **kwargs)
        return torch.full_like(token, 10**9) if len(calls) > 2 else token

    monkeypatch.setattr(zoo.generation.sampling, "next_tokens", bad_after_two)  # where it is used
    code, out, err = run(capsys, "generate", "gpt2-124m", "Hello", "--random", "--temperature", "0")
    assert code == 2 and out.startswith("Hello") and out.endswith("\n")
    assert err.startswith("zoo: error: ") and err.count("\n") == 1
