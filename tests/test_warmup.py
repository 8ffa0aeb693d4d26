"""``normlab warmup`` is kept for old scripts: it says there is nothing to compile and exits 0."""

from __future__ import annotations

from normlab import cli
from normlab.ops import extension


def test_warmup_says_there_is_nothing_to_compile(capsys):
    assert cli.main(["warmup"]) == 0
    out = capsys.readouterr().out
    assert "nothing to compile" in out
    if extension.available():
        assert extension.build_info()["torch"] in out
