"""Quantization for inference and QLoRA: the quantized linear layers and ``quantize_``
(:mod:`~zoo.quant.layers`), and the input gradient of a frozen quantized layer
(:mod:`~zoo.quant.grad`)."""
