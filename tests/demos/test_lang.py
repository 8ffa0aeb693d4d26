"""``normlab demo ... --lang id``: the explanations in Bahasa Indonesia, the numbers unchanged.

The numbers checked in the Indonesian printouts are the chapters' printed outputs
(seeds/000 layernorm_manual.py, seeds/001 batchnorm_train_eval.py), as in test_demos.py."""

from __future__ import annotations

import re
import subprocess
import sys

import pytest

from normlab.demos import SOURCE_PAGE, _lang, batchnorm, compare, layernorm, shapes

DEMOS = {"layernorm": layernorm, "batchnorm": batchnorm, "shapes": shapes, "compare": compare}
# a line of numbers each chapter prints, and Indonesian words the explanation must use
PRINTED = {
    "layernorm": ["[1.135, 1.666, 0.215, -3.637, 0.277, -1.038]", "[-0.879, 0.704, -0.857, 0.443, 0.878, -0.157]"],
    "batchnorm": ["[-1.3416, -1.3416, -1.3416]", "[0.4, 0.5, 0.6]", "[1.567, 1.567, 1.567]"],
    "shapes": ["torch.Size([32, 10, 512])", "torch.Size([512])"],
    # torch's own refusal of a one-sample batch in train mode, and (6,) weight and bias of a 6-feature layer
    "compare": ["Expected more than 1 value per channel when training, got input size torch.Size([1, 6])",
                "weight [6], bias [6]"],
}
WORDS = {"layernorm": ["sampel", "sendirian", "keluaran"], "batchnorm": ["mode eval", "variansi", "sendirian"],
         "shapes": ["Bentuk", "ukuran batch"],
         "compare": ["sumbu statistik", "teman satu batch", "ukuran batch 1", "tidak (ValueError)", "tanpa buffer"]}


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


NUMBER = re.compile(r"-?\d+(?:\.\d+)?(?:e[-+]?\d+)?")


def test_compare_indonesian_printout_has_the_english_numbers_in_the_same_places():
    en, id_ = (compare.render(compare.run(lang=lang)).splitlines() for lang in ("en", "id"))
    assert [NUMBER.findall(line) for line in en] == [NUMBER.findall(line) for line in id_]
    assert "yes" in " ".join(en) and not re.search(r"\b(yes|no)\b", "\n".join(id_))


def test_compare_differences_from_torch_are_explained_in_indonesian():
    r = compare.run(lang="id")
    r = {**r, "same_as_torch": False,
         "differences": [{"layer": "LayerNorm", "row": "depends_eval", "normlab": "yes", "torch": "no"}]}
    text = compare.render(r)
    assert "torch.nn berbeda:" in text
    assert "LayerNorm / output bergantung pada teman satu batch (eval): normlab 'ya', torch.nn 'tidak'" in text


@pytest.mark.parametrize("args,rc", [(["--lang", "id"], 0), (["--lang", "en"], 0), (["--lang", "xx"], 2)])
def test_compare_cli_lang(args, rc):
    p = subprocess.run([sys.executable, "-m", "normlab", "compare", *args], capture_output=True, text=True,
                       timeout=300)
    assert p.returncode == rc, p.stderr
    if rc == 0:
        assert "torch.Size([1, 6])" in p.stdout and "weight [6], bias [6]" in p.stdout
        assert ("diukur pada input (8, 6)" in p.stdout) == (args[1] == "id")
        assert ("measured on an (8, 6) input" in p.stdout) == (args[1] == "en")
    else:
        assert "Traceback" not in p.stderr and "--lang" in p.stderr
    with pytest.raises(ValueError, match="normlab compare: expected --lang"):
        compare.run(lang="fr")


# English words a translated line must not keep (torch's own error message, quoted, may; "output"
# is Indonesian too, and the page's path stays a path)
ENGLISH = re.compile(r"\b(the|and|with|of|see|chapter|source|samples?|alone|same)\b", re.I)


@pytest.mark.parametrize("name", DEMOS)
def test_no_english_line_left_in_the_indonesian_printout(name):
    mod = DEMOS[name]
    text = mod.render(mod.run(lang="id")).replace(PRINTED["compare"][0], "").replace(SOURCE_PAGE, "")
    left = [line for line in text.splitlines() if ENGLISH.search(line)]
    assert not left, left
