"""gdn: Gated DeltaNet (the gated delta rule of Qwen3-Next and Qwen3.5) in C++, fast and exact.

The C++ library's CPU kernels, callable from JAX through XLA's FFI and from PyTorch through
torch.library custom ops::

    import gdn.jax
    o, final_state = gdn.jax.chunk_gated_delta_rule(q, k, v, g, beta, output_final_state=True)

    import gdn.torch
    o, final_state = gdn.torch.chunk_gated_delta_rule(q, k, v, g, beta, output_final_state=True)

``import gdn`` needs NumPy alone; ``gdn.jax`` needs JAX and ``gdn.torch`` PyTorch, the package's
extras (``pip install ".[jax]"``, ``".[torch]"``, ``".[hf]"`` for transformers' models from a
checkout), and each says which to install when its framework is missing.

``gdn.jax`` has the core op (fla's ``chunk_gated_delta_rule``), the fused layer op
(``fused_gdn``) and Tokamax's serving call (``fused_conv1d_gdn``); docs/jax.md explains them.
``gdn.torch`` has fla's ``chunk_gated_delta_rule`` and ``fused_recurrent_gated_delta_rule`` as
PyTorch custom ops and ``patch(model)`` for transformers' Qwen3-Next / Qwen3.5; docs/torch.md.
"""

from gdn._gdn import __version__, cpu_isa, default_threads, set_pool_cpus

__all__ = ["__version__", "cpu_isa", "default_threads", "set_pool_cpus"]
