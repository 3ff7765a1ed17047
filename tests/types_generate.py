"""Checked by mypy, not run: ``generate``'s overloads give each prompt form its own return
type, as a user's type checker sees them. ``mypy`` (the first half of the test command) reads
this file through ``[tool.mypy] files`` in pyproject.toml; a wrong overload fails it."""

from collections.abc import Iterator
from typing import Any

import torch
from typing_extensions import assert_type

from zoo.generation import (
    GenerationConfig,
    generate,
    generate_ids,
    generate_text,
    generate_texts,
    stream_ids,
    stream_text,
)

m: Any = None
assert_type(generate(m, "hi"), str)
assert_type(generate(m, "hi", stream=True), Iterator[str])
assert_type(generate(m, ["a", "b"]), list[str])
assert_type(generate(m, torch.tensor([[1]])), torch.Tensor)
assert_type(generate(m, [1, 2]), list[int])
assert_type(generate(m, [[1, 2], [3]]), list[list[int]])
c = GenerationConfig()
assert_type(generate_ids(m, torch.tensor([[1]]), None, c), torch.Tensor)
assert_type(stream_ids(m, torch.tensor([[1]])), Iterator[torch.Tensor])
assert_type(generate_text(m, "hi", c), str)
assert_type(generate_texts(m, ["hi"], c), list[str])
assert_type(stream_text(m, "hi", c), Iterator[str])
