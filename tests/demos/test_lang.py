"""``normlab demo ... --lang id``: the explanations in Bahasa Indonesia, the numbers unchanged.

The numbers checked in the Indonesian printouts are the chapters' printed outputs
(seeds/000 layernorm_manual.py, seeds/001 batchnorm_train_eval.py), as in test_demos.py."""

from __future__ import annotations

import subprocess
import sys

import pytest

from normlab.demos import _lang, batchnorm, layernorm, shapes

DEMOS = {"layernorm": layernorm, "batchnorm": batchnorm, "shapes": shapes}
# a line of numbers each chapter prints, and Indonesian words the explanation must use
PRINTED = {
    "layernorm": ["[1.135, 1.666, 0.215, -3.637, 0.277, -1.038]", "[-0.879, 0.704, -0.857, 0.443, 0.878, -0.157]"],
    "batchnorm": ["[-1.3416, -1.3416, -1.3416]", "[0.4, 0.5, 0.6]", "[1.567, 1.567, 1.567]"],
    "shapes": ["torch.Size([32, 10, 512])", "torch.Size([512])"],
}
WORDS = {"layernorm": ["sampel", "sendirian", "keluaran"], "batchnorm": ["mode eval", "variansi", "sendirian"],
         "shapes": ["Bentuk", "ukuran batch"]}


def _numbers(result: dict) -> dict:
    return {k: v for k, v in result.items() if k != "lang"}


@pytest.mark.parametrize("name", DEMOS)
def test_numbers_do_not_change_with_the_language(name):
    mod = DEMOS[name]
    en, id_ = mod.run(lang="en"), mod.run(lang="id")
    assert (en["lang"], id_["lang"]) == ("en", "id")
    assert _numbers(en) == _numbers(id_)


@pytest.mark.parametrize("name", DEMOS)
def test_indonesian_printout(name):
    mod = DEMOS[name]
    text_id, text_en = mod.render(mod.run(lang="id")), mod.render(mod.run(lang="en"))
    for line in PRINTED[name]:
        assert line in text_id and line in text_en
    for word in WORDS[name]:
        assert word in text_id and word not in text_en
    # the same layout: as many lines, the numbers in the same places
    assert len(text_id.splitlines()) == len(text_en.splitlines())


def test_every_english_sentence_has_its_indonesian_entry():
    for text, translated in _lang.ID.items():
        fields = {f.split("}")[0] for f in text.split("{")[1:]}
        assert {f.split("}")[0] for f in translated.split("{")[1:]} == fields, text


@pytest.mark.parametrize("args,rc", [(["--lang", "id"], 0), (["--lang", "en"], 0), (["--lang", "xx"], 2)])
def test_cli_lang(args, rc):
    p = subprocess.run([sys.executable, "-m", "normlab", "demo", "batchnorm", *args], capture_output=True, text=True,
                       timeout=300)
    assert p.returncode == rc, p.stderr
    if rc == 0:
        assert "[-1.3416, -1.3416, -1.3416]" in p.stdout
        assert ("mode train pada" in p.stdout) == (args[1] == "id")
    else:
        assert "Traceback" not in p.stderr and "--lang" in p.stderr
    with pytest.raises(ValueError, match="--lang"):
        batchnorm.run(lang="fr")
