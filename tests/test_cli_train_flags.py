"""``zoo train``'s training flags are made from :class:`zoo.train.TrainConfig`'s fields
(``zoo.cli.flags``): one flag per field, with the field's default, type, choices and the help
of the class docstring's ``Args:`` entry; a field the flags cannot show is refused."""

from __future__ import annotations

import argparse
import dataclasses
import typing
from typing import Literal

import pytest

from zoo.cli import COMMANDS, build_parser
from zoo.cli.flags import add_dataclass_flags, dataclass_values, field_docs, flag
from zoo.cli.train import DERIVED, train_config
from zoo.train import TrainConfig

REQUIRED = ["train", "shakespeare-byte", "--data", "text.txt", "--out", "run"]


def train_actions() -> dict[str, argparse.Action]:
    parser = argparse.ArgumentParser()
    COMMANDS["train"].arguments(parser)
    return {a.dest: a for a in parser._actions}


def test_every_field_has_a_flag_with_its_default_type_and_help():
    actions = train_actions()
    docs = field_docs(TrainConfig)
    hints = typing.get_type_hints(TrainConfig)
    for field in dataclasses.fields(TrainConfig):
        action = actions[field.name]
        assert action.option_strings == [flag(field.name)], field.name
        assert docs[field.name] and action.help, field.name
        if field.name in DERIVED:
            assert action.default is None
            assert action.help.endswith(f"(default: {DERIVED[field.name].text})")
        else:
            assert action.default == field.default, field.name
            assert "(default: " in action.help, field.name
        if typing.get_origin(hints[field.name]) is Literal:
            assert tuple(action.choices or ()) == typing.get_args(hints[field.name])
    for action in actions.values():  # the other flags of zoo train say theirs too
        if action.option_strings and action.dest != "help" and not action.required:
            assert "default: " in (action.help or ""), action.option_strings
    # the defaults on the command line are TrainConfig's own (min_lr: lr / 10 = 1e-4)
    assert train_config(build_parser().parse_args(REQUIRED)) == TrainConfig()


def test_the_flags_set_every_field():
    values = {
        "steps": 7, "batch_size": 6, "grad_accum": 3, "lr": 0.02, "min_lr": 0.001,
        "warmup": 2, "weight_decay": 0.5, "betas": (0.8, 0.95), "clip": 0.25,
        "eval_every": 9, "eval_batches": 4, "checkpoint_every": 0, "seed": 5,
        "val_fraction": 0.2, "time_budget": 30.0, "loss_target": 1.5, "bf16": True,
    }  # fmt: skip
    assert set(values) == {f.name for f in dataclasses.fields(TrainConfig)}
    argv = ["--bf16"]
    for name, value in values.items():
        if not isinstance(value, bool):
            argv += [flag(name), *map(str, value if isinstance(value, tuple) else [value])]
    assert train_config(build_parser().parse_args([*REQUIRED, *argv])) == TrainConfig(**values)
    # min_lr follows --lr unless given; checkpoint_every takes "none", the default
    args = build_parser().parse_args([*REQUIRED, "--lr", "0.02", "--checkpoint-every", "none"])
    assert train_config(args) == TrainConfig(lr=0.02, min_lr=0.002)


def test_the_help_reads_as_the_docstring_with_flags_for_fields():
    actions = train_actions()
    assert " ".join(actions["grad_accum"].help.split()) == (
        "micro-batches per optimizer step (--batch-size must divide by --grad-accum times "
        "the number of processes) (default: 1)"
    )
    assert actions["seed"].help.endswith("as zoo.generate takes (default: 0)")
    assert actions["checkpoint_every"].help.endswith("every --eval-every steps) (default: none)")


@dataclasses.dataclass(frozen=True)
class Settings:
    """Settings.

    Args:
        mode: how (``fast`` or ``slow``).
        sizes: one or more sizes (100% of them).
        name: a name,
            on two lines.
    """

    mode: Literal["fast", "slow"] = "fast"
    sizes: tuple[int, ...] = (1,)
    name: str | None = None


def test_a_dataclass_becomes_flags_choices_and_values():
    parser = argparse.ArgumentParser()
    add_dataclass_flags(parser, Settings)
    actions = {a.dest: a for a in parser._actions}
    assert actions["mode"].choices == ("fast", "slow")
    assert actions["name"].help == "a name, on two lines (default: none)"
    assert "(100% of them) (default: 1)" in parser.format_help()
    args = parser.parse_args(["--mode", "slow", "--sizes", "2", "3", "--name", "x"])
    assert dataclass_values(args, Settings) == {"mode": "slow", "sizes": (2, 3), "name": "x"}
    with pytest.raises(SystemExit):
        parser.parse_args(["--mode", "medium"])


def test_a_field_without_help_or_without_a_flag_type_is_refused():
    @dataclasses.dataclass
    class Undocumented:
        """A settings class with a field added later.

        Args:
            documented: yes.
        """

        documented: int = 1
        added: int = 2

    with pytest.raises(TypeError, match=r"Undocumented.added has no entry in its Args"):
        add_dataclass_flags(argparse.ArgumentParser(), Undocumented)

    @dataclasses.dataclass
    class Mapped:
        """A settings class with a field no flag can take.

        Args:
            table: a mapping.
        """

        table: dict[str, int] | None = None

    with pytest.raises(TypeError, match=r"Mapped.table: no flag for"):
        add_dataclass_flags(argparse.ArgumentParser(), Mapped)
