"""Sequence classification: any decoder body plus a linear head on the last real token (GPT-1's
fine-tuning). ``zoo.train.classifier(model, labels)`` makes one; ``zoo train --task classify``
trains it; the head is saved with the checkpoint.

This module only declares specs.
"""

from __future__ import annotations

from zoo.plugin.hookspecs import hookimpl
from zoo.plugin.specs import ArchitectureSpec


@hookimpl
def zoo_architectures() -> list[ArchitectureSpec]:
    return [
        ArchitectureSpec(
            name="sequence-classifier",
            config="zoo.nn.classifier:ClassifierConfig",
            model="zoo.nn.classifier:SequenceClassifier",
            description="a decoder body with a linear classification head on its last token",
            blocks=("the body's blocks", "linear head on the last non-padding position"),
        )
    ]
