"""normlab.demos: the source chapters' scripts, recomputed with normlab beside torch.nn.

Each module has ``run(...) -> dict`` (every number, as plain lists, floats,
bools and shapes; what the tests check) and ``render(result) -> str`` (the
plain-text report that ``normlab demo ...`` / ``normlab compare`` print). A
module may also define ``add_arguments(parser)`` for its command-line options,
whose values are passed to ``run`` as keyword arguments.

- ``layernorm``: seeds/000 ``layernorm_manual.py``
- ``batchnorm``: seeds/001 ``batchnorm_train_eval.py``
- ``shapes``:    seeds/003 ``nn.LayerNorm(d_model)`` on ``[32, 10, 512]``
- ``compare``:   seeds/000 closing BatchNorm-vs-LayerNorm comparison, measured
"""

__all__ = ["layernorm", "batchnorm", "shapes", "compare"]
