"""GGUF, llama.cpp's file format, both ways: ``zoo.load("model.gguf")`` and
``zoo.export(model, "out.gguf", layout="gguf", type=...)`` (``zoo convert ... --to gguf``).

- :mod:`.header`: the file's header, every count, length, shape and offset bounded;
- :mod:`.tensors`: its tensors, dequantized by the ``gguf`` package;
- :mod:`.families`: what llama.cpp writes for each family, as data;
- :mod:`.read`: a file as a family's config and zoo state; :mod:`.load`: as a model;
- :mod:`.vocab`: the tokenizer and chat template in the metadata, both ways;
- :mod:`.write`: a model as a file llama.cpp runs.

Reading and writing need the ``gguf`` package (``pip install 'torch-zoo[gguf]'``).
"""
