"""Every ``ZOO_*`` variable is read in one place (zoo.settings), typed, and refused with a
clear error when zoo cannot read it; model code receives the values instead of reading the
environment (``ZOO_CUDA_GRAPHS=0`` reaches the decoder through ``zoo.generate``)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch

import zoo
from zoo.errors import ConfigError
from zoo.settings import VARIABLES, Settings

SOURCE = Path(zoo.__file__).parent


def test_every_zoo_variable_the_code_names_is_in_the_table():
    named = {
        match
        for path in SOURCE.rglob("*.py")
        for match in re.findall(r"\bZOO_[A-Z_]*[A-Z]\b", path.read_text())
    }
    assert named, "found no variable at all: the scan is broken"
    assert named <= {variable for variable, _ in VARIABLES.values()}


def test_each_variable_name_is_spelled_once_in_the_settings_table():
    """Other modules take a variable's name from VARIABLES (for their messages), never a
    second string literal that could drift from the one zoo reads."""
    spelled = {
        f"{path.relative_to(SOURCE)}: {match}"
        for path in SOURCE.rglob("*.py")
        if path.name != "settings.py"
        for match in re.findall(r"[\"'](?:ZOO_[A-Z_]*|XDG_CACHE_HOME)[\"']", path.read_text())
    }
    assert spelled == set()


def test_only_the_settings_module_reads_the_environment_for_zoo():
    readers = [
        f"{path.relative_to(SOURCE)}:{n}"
        for path in SOURCE.rglob("*.py")
        if path.name != "settings.py"
        for n, line in enumerate(path.read_text().splitlines(), 1)
        if re.search(r"environ(\.get)?[\[(]\s*[\"']ZOO_", line)
    ]
    assert readers == []


def test_the_cache_variables_are_read_here_only():
    # ZOO_CACHE_DIR and XDG_CACHE_HOME are spelled nowhere else in the code
    spelled = [
        f"{path.relative_to(SOURCE)}:{n}"
        for path in SOURCE.rglob("*.py")
        if path.name != "settings.py"
        for n, line in enumerate(path.read_text().splitlines(), 1)
        if re.search(r"[\"']XDG_CACHE_HOME|[\"']ZOO_CACHE_DIR[\"']", line)
    ]
    assert spelled == []


def test_the_cache_folder():
    home = str(Path("~/.cache/zoo").expanduser())
    assert Settings.from_env({}).cache_root == home
    assert Settings.from_env({"XDG_CACHE_HOME": "/x"}).cache_root == str(Path("/x/zoo"))
    both = {"XDG_CACHE_HOME": "/x", "ZOO_CACHE_DIR": "/y"}
    assert Settings.from_env(both).cache_root == "/y"


def test_defaults_and_values():
    assert Settings.from_env({}) == Settings()
    settings = Settings.from_env(
        {"ZOO_CUDA_GRAPHS": "0", "ZOO_PREFER": " a, b ,", "ZOO_HUB_DEADLINE": "2.5",
         "ZOO_HUB_MAX_FILE_BYTES": "1024", "ZOO_ALLOW_LARGE": "yes", "ZOO_STRICT_PLUGINS": ""}
    )  # fmt: skip
    assert settings.cuda_graphs is False and settings.allow_large is True
    assert settings.prefer == ("a", "b") and settings.strict_plugins is False
    assert settings.hub_deadline == 2.5 and settings.hub_max_file_bytes == 1024


@pytest.mark.parametrize(
    ("variable", "text"),
    [
        ("ZOO_CUDA_GRAPHS", "maybe"),
        ("ZOO_HUB_DEADLINE", "soon"),
        ("ZOO_HUB_DEADLINE", "nan"),
        ("ZOO_HUB_MAX_FILE_BYTES", "-1"),
        ("ZOO_DIST_TIMEOUT", "0"),
    ],
)
def test_a_value_zoo_cannot_read_is_an_error_naming_the_variable(variable, text):
    with pytest.raises(ConfigError, match=rf"{variable}={text!r}"):
        Settings.from_env({variable: text})


def test_zoo_cuda_graphs_0_reaches_the_decoder_through_generate(monkeypatch):
    from zoo.generation.core import _session_options
    from zoo.runtime import start_decoding

    model = zoo.build("gpt2-124m", n_layers=1, d_model=32, n_heads=2, d_ff=64)
    assert _session_options(False) == {"cuda_graphs": True}
    monkeypatch.setenv("ZOO_CUDA_GRAPHS", "0")
    assert _session_options(False) == {"cuda_graphs": False}
    ids = torch.tensor([[1, 2, 3]])
    session = start_decoding(model, ids, None, 2, cuda_graphs=False)
    assert type(session).__name__ == "DecoderSession"
