"""Training zoo models: ``zoo.train.train(model, data, out, config=TrainConfig(...))`` and
``zoo train NAME --data TEXT --out DIR``, on one process or under ``torchrun`` (DDP).

    >>> import zoo
    >>> from zoo.train import TrainConfig, train
    >>> model = zoo.build("gpt2-124m", n_layers=4, d_model=128, n_heads=4, d_ff=512)
    >>> result = train(model, "notes.txt", "runs/notes", config=TrainConfig(steps=200))
    >>> zoo.load(result.checkpoint)

What differs between tasks (decoder LM, classifier, encoder-decoder: the data, the loss, the
blocks FSDP2 shards) is a :class:`TaskSpec` the model's class declares (``train_task``); a
plugin adds a task with a spec of its own (:mod:`zoo.train.task`).

Importing the package imports no torch: :class:`TrainConfig`, :class:`DataError` and the
errors are plain Python (``zoo train`` checks its arguments with them before torch loads);
the rest is imported on first use.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .._lazy import lazy_attributes
from .config import TrainConfig
from .data_files import DataError
from .errors import DivergedError, ResumeError, RunLockedError

if TYPE_CHECKING:  # type checkers see the real names
    from ..nn.base import ZooModel
    from ..nn.classifier import SequenceClassifier
    from .data import TokenData, labels_in, train_tokenizer
    from .loop import TrainResult, train
    from .task import TaskSpec

#: Imported on first use: they import torch.
_LAZY = {
    "ZooModel": "zoo.nn.base:ZooModel",
    "SequenceClassifier": "zoo.nn.classifier:SequenceClassifier",
    "Parts": "zoo.nn.parts:Parts",
    "TokenData": "zoo.train.data:TokenData",
    "labels_in": "zoo.train.data:labels_in",
    "train_tokenizer": "zoo.train.data:train_tokenizer",
    "TrainResult": "zoo.train.loop:TrainResult",
    "train": "zoo.train.loop:train",
    "TaskSpec": "zoo.train.task:TaskSpec",
}


__getattr__ = lazy_attributes(__name__, _LAZY)


__all__ = [
    "DataError",
    "DivergedError",
    "ResumeError",
    "RunLockedError",
    "TaskSpec",
    "TokenData",
    "TrainConfig",
    "TrainResult",
    "classifier",
    "labels_in",
    "train",
    "train_tokenizer",
]


def classifier(model: ZooModel, labels: list[str]) -> SequenceClassifier:
    """``model`` (a decoder, pretrained or not) under a new linear head over ``labels``, read
    from its last real token, as GPT-1 is fine-tuned; :func:`train` on a ``text<TAB>label``
    file trains it, and the head is saved with the checkpoint."""
    import contextlib

    from ..errors import ZooError
    from ..nn.classifier import SequenceClassifier
    from ..nn.parts import Parts
    from ..plugin.current import get_registry

    registry = get_registry()
    body = registry.architecture(type(model.config).architecture)
    parts = Parts({}, architecture=lambda name: (body.config_class, registry.model_factory(body)))
    head = SequenceClassifier.around(model, labels, parts)
    if head.tokenizer is None and model.name:  # the body's named model's tokenizer
        with contextlib.suppress(ZooError):
            head.tokenizer = registry.model_tokenizer(model.name).load()
    return head
