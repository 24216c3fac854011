"""Benchmarks for cunorm: ``python -m cunorm.bench OP``.

Times cunorm's row-wise ops (softmax, log_softmax, layer_norm, rms_norm, the two norms fused with a
residual add, and the gradients softmax_backward, log_softmax_backward, layer_norm_backward and
rms_norm_backward) on the standard sweep
(shape ``(49152, cols)``, float16, bfloat16 and float32) against PyTorch eager, ``torch.compile``,
``cupyx.scipy.special``, JAX under ``jax.jit`` and a minimal hand-written Triton kernel, all on the
same input arrays, and reports effective bandwidth (bytes read + bytes written per second) next to
the device-to-device copy bandwidth measured in the same run. Results go to ``benchmarks/results/``
as markdown, JSON and a PNG plot.

``python -m cunorm.bench attention`` (:mod:`cunorm.bench.attention`) has its own sweeps: the
forward pass in FlashAttention's convention (TFLOP/s), decoding over a long KV cache (GB/s of
K/V read) and the peak extra memory at L = 65536, against every torch SDPA backend and JAX's
``dot_product_attention``.

Without a CUDA GPU it times cunorm's NumPy reference path on a small sweep instead.
"""
