"""Sequence classification on top of a decoder, as GPT-1 is fine-tuned: a linear head reads
the final hidden state of the last real (non-padding) token."""

from __future__ import annotations

import dataclasses
from typing import Any, ClassVar

import torch
from torch import Tensor, nn

from ..config import ModelConfig
from ..errors import PluginContractError
from .base import ZooModel, check_padding_mask
from .parts import Parts, parts_for

__all__ = ["ClassifierConfig", "SequenceClassifier"]


@dataclasses.dataclass(frozen=True, kw_only=True)
class ClassifierConfig(ModelConfig):
    """A classifier: a body (any registered architecture whose model offers ``hidden()``,
    such as the decoders of ``zoo.nn.DecoderLM``) and the label names.

    Args:
        body: the body's architecture name (``"gpt1"``, ``"gpt2"``...).
        body_config: the body's config fields.
        labels: the class names; the head has one output per label, in this order.
    """

    architecture: ClassVar[str] = "sequence-classifier"

    body: str
    body_config: dict
    labels: list

    def validate(self) -> None:
        self._require(len(self.labels) >= 2, "labels", "needs at least two classes")
        self._require(all(isinstance(x, str) and x for x in self.labels), "labels", "must be names")
        self._require(len(set(self.labels)) == len(self.labels), "labels", "must be distinct")
        for size in ("vocab_size", "context_length", "d_model"):  # the body's config checks
            value = self.body_config.get(size)  # the rest when the body is built
            self._require(
                isinstance(value, int) and not isinstance(value, bool) and value > 0,
                "body_config",
                f"needs a positive integer {size}",
            )

    @property
    def vocab_size(self) -> int:
        return int(self.body_config["vocab_size"])

    @property
    def context_length(self) -> int:
        return int(self.body_config["context_length"])


class SequenceClassifier(ZooModel):
    """``forward(input_ids, attention_mask=None)`` -> class logits ``(B, n_labels)``."""

    config: ClassifierConfig
    body: Any  # any architecture offering hidden(); checked when built
    replayable_init = True  # when its body's is (zoo.nn.materialize.replays_init checks)
    train_task: ClassVar[str] = "classify"  # zoo.train's task spec (zoo.train.task)

    def __init__(self, config: ClassifierConfig, parts: Parts | None = None) -> None:
        super().__init__(config)
        body_config_class, make_body = parts_for(config, parts).architecture(config.body)
        self.body = make_body(body_config_class.from_dict(config.body_config))
        if not callable(getattr(self.body, "hidden", None)):
            raise PluginContractError(
                f"architecture {config.body!r} offers no hidden(input_ids, attention_mask) "
                "method, so no classification head can read it (zoo.nn.DecoderLM offers one)"
            )
        self.head = nn.Linear(self.body.config.d_model, len(config.labels))

    @classmethod
    def around(
        cls, body: ZooModel, labels: list[str], parts: Parts | None = None
    ) -> SequenceClassifier:
        """A classifier whose body is ``body`` (its weights copied; a new head) and its
        tokenizer. ``parts`` resolve the body's names (default: ``body``'s class with the
        built-in components; ``zoo.train.classifier`` passes the registry's)."""
        config = ClassifierConfig(
            body=type(body.config).architecture, body_config=body.config.to_dict(), labels=labels
        )
        if parts is None:
            parts = Parts({}, architecture=lambda name: (type(body.config), type(body)))
        device = next(body.parameters()).device
        with torch.device(device):
            model = cls(config, parts)
        model.body.load_state_dict(body.state_dict())
        model.tokenizer = body.tokenizer
        return model

    def start_decoding(self, *args: Any, **kwargs: Any) -> Any:
        """A classifier does not generate: it gives one label per text. Refused with what
        to use instead (``zoo classify``, or ``model(ids).softmax(-1)``)."""
        raise ValueError(
            f"this model is a sequence classifier (labels: {', '.join(self.config.labels)}; "
            f"body {self.config.body}): it gives one label per text and does not generate "
            "text. Classify with `zoo classify CHECKPOINT TEXT...`, or in Python "
            "model(ids).softmax(-1) -> (batch, labels)"
        )

    def example_inputs(
        self, batch_size: int = 2, seq_len: int = 8, *, generator: torch.Generator | None = None
    ) -> dict[str, Tensor]:
        return self.body.example_inputs(batch_size, seq_len, generator=generator)

    def forward(self, input_ids: Tensor, attention_mask: Tensor | None = None) -> Tensor:
        states = self.body.hidden(input_ids, attention_mask)  # (B, T, d_model)
        keep = check_padding_mask(attention_mask, tuple(input_ids.shape))
        last = torch.full((input_ids.shape[0],), input_ids.shape[1] - 1, device=states.device)
        if keep is not None:  # the last real token of each row, whatever side the padding
            last = keep.shape[1] - 1 - keep.flip(1).int().argmax(dim=1)
        rows = torch.arange(input_ids.shape[0], device=states.device)
        return self.head(states[rows, last])  # (B, n_labels)
