"""normlab.demos: the source chapters' scripts, recomputed with normlab beside torch.nn.

Each module has ``run(...) -> dict`` (every number, as plain lists, floats,
bools and shapes; what the tests check) and ``render(result) -> str`` (the
plain-text report that ``normlab demo ...`` / ``normlab compare`` print). A
module may also define ``add_arguments(parser)`` for its command-line options,
whose values are passed to ``run`` as keyword arguments.

The source chapters are three texts normlab was written from; :data:`SOURCES` says
in a line each what they are, and the documentation page ``docs/chapters/source.md``
("The source chapters") describes what each teaches and which numbers it printed.
Every demo's output names its chapter and points to that page.

- ``layernorm``: the LayerNorm chapter's ``layernorm_manual.py``
- ``batchnorm``: the BatchNorm chapter's ``batchnorm_train_eval.py``
- ``shapes``:    the LayerNorm answer's ``nn.LayerNorm(d_model)`` on ``[32, 10, 512]``
- ``compare``:   the LayerNorm chapter's closing BatchNorm-vs-LayerNorm comparison, measured
"""

__all__ = ["layernorm", "batchnorm", "shapes", "compare", "SOURCES", "SOURCE_PAGE", "source_label"]

#: Where the source chapters are described (the documentation site's "The source chapters").
SOURCE_PAGE = "docs/chapters/source.md"

#: The source chapters, in normlab's words: key -> (name, what it is).
SOURCES = {
    "layernorm": ("the LayerNorm chapter",
                  "a chapter of an Indonesian deep-learning textbook: LayerNorm written by hand against "
                  "nn.LayerNorm, per-sample statistics, batch independence, BatchNorm vs LayerNorm"),
    "batchnorm": ("the BatchNorm chapter",
                  "the next chapter of the same textbook: BatchNorm1d's parameters and buffers, train vs eval "
                  "mode, the running statistics, and a training-stability experiment with and without BatchNorm"),
    "answer": ("the LayerNorm answer",
               "a Russian question-and-answer text on LayerNorm in transformers: nn.LayerNorm(d_model) on a "
               "[batch, seq_len, d_model] tensor and why it is used there"),
}


def source_label(key: str, what: str) -> str:
    """A demo's provenance, short enough for an 80-column line after ``source: ``:
    ``"LayerNorm chapter, layernorm_manual.py (see docs/chapters/source.md)"``."""
    return f"{SOURCES[key][0].removeprefix('the ')}, {what} (see {SOURCE_PAGE})"
