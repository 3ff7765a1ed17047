"""zoo's CPU kernels and their glue: the C kernels for batch-1 decoding (``_native.c``,
``_native_int8.c``, ``_native_block.c``, built by ``pip install`` as the optional extension
``zoo.kernels._native``), their ctypes loading (:mod:`~zoo.kernels.native`), the one-call
step's structures (:mod:`~zoo.kernels.native_abi`, :mod:`~zoo.kernels.native_facts`), the
int8 kernel (:mod:`~zoo.kernels.native_int8`) and the thread count of a decoding step
(:mod:`~zoo.kernels.threads`). No model code: :mod:`zoo.nn` calls these."""
