"""The demos' explanations in English (``en``) and Bahasa Indonesia (``id``), the chapters'
own language. Only words change with ``--lang``: every number is computed in ``run()``.

``say(lang, text, **fields)`` looks ``text`` (the English sentence, a format string) up in
``ID`` when ``lang == "id"`` and fills in ``fields``; an English sentence without an
Indonesian entry is a bug, raised as KeyError (the tests render every demo in both languages).
"""

from __future__ import annotations

import argparse

LANGS = ("en", "id")

ID = {
    "source: {chapter}": "sumber: {chapter}",
    # the chapters' labels (normlab.demos.source_label), translated whole
    "LayerNorm chapter, layernorm_manual.py (see docs/chapters/source.md)":
        "bab LayerNorm, layernorm_manual.py (lihat docs/chapters/source.md)",
    "BatchNorm chapter, batchnorm_train_eval.py (see docs/chapters/source.md)":
        "bab BatchNorm, batchnorm_train_eval.py (lihat docs/chapters/source.md)",
    "LayerNorm answer, nn.LayerNorm(d_model) (see docs/chapters/source.md)":
        "jawaban tentang LayerNorm, nn.LayerNorm(d_model) (lihat docs/chapters/source.md)",
    "LayerNorm chapter, closing comparison (see docs/chapters/source.md)":
        "bab LayerNorm, perbandingan penutupnya (lihat docs/chapters/source.md)",
    # layernorm
    "LayerNorm by hand vs normlab.nn.LayerNorm vs torch.nn.LayerNorm":
        "LayerNorm manual vs normlab.nn.LayerNorm vs torch.nn.LayerNorm",
    "x = randn(4, 6) * 3.0 + 5.0 with seed {seed} (4 samples x 6 features):":
        "x = randn(4, 6) * 3.0 + 5.0 dengan seed {seed} (4 sampel x 6 fitur):",
    "output (gamma * x_hat + beta):": "keluaran (gamma * x_hat + beta):",
    "x_hat (before the affine): per row mean 0 and std 1, column means anything:":
        "x_hat (sebelum gamma/beta): tiap baris rata-rata 0 dan simpangan baku 1, rata-rata kolom bebas:",
    "  (row means: largest |mean| {tiny:.1e}, float32 rounding; the chapter prints\n"
    "   them as -0.0: a tiny negative number rounded to 4 decimals keeps its sign)":
        "  (rata-rata baris: |rata-rata| terbesar {tiny:.1e}, pembulatan float32; bab ini\n"
        "   mencetaknya -0.0: bilangan negatif sangat kecil yang dibulatkan tetap bertanda)",
    "row mean": "rata-rata baris", "row std": "std baris", "column mean": "rata-rata kolom",
    "manual": "manual",
    "comparison": "perbandingan", "max abs difference": "selisih mutlak maksimum",
    "manual vs torch.nn": "manual vs torch.nn", "normlab vs torch.nn": "normlab vs torch.nn",
    "normlab vs manual": "normlab vs manual",
    "the third sample alone vs inside a batch with 3 random mates (randn(3, 6) * 10.0):":
        "sampel ketiga sendirian vs di dalam batch bersama 3 teman acak (randn(3, 6) * 10.0):",
    "alone": "sendirian", "in a batch": "di dalam batch", "identical?": "identik?",
    "contrast: BatchNorm1d(6) in train mode, the same sample in two batches:":
        "pembanding: BatchNorm1d(6) dalam mode train, sampel yang sama di dua batch:",
    "one zero mate": "satu teman nol", "3 random mates": "3 teman acak",
    # batchnorm
    "BatchNorm1d: batch statistics, running statistics, train vs eval":
        "BatchNorm1d: statistik batch, statistik berjalan, train vs eval",
    "1. anatomy of BatchNorm1d(3), freshly built:": "1. anatomi BatchNorm1d(3) yang baru dibuat:",
    "2. train mode on x1 = [[1, 2, 3], [3, 4, 5], [5, 6, 7], [7, 8, 9]]: each column gets mean 0, variance 1":
        "2. mode train pada x1 = [[1, 2, 3], [3, 4, 5], [5, 6, 7], [7, 8, 9]]: tiap kolom menjadi "
        "rata-rata 0, variansi 1",
    "output": "keluaran", "column variance": "variansi kolom",
    "running_mean after": "running_mean sesudahnya", "running_var after": "running_var sesudahnya",
    "  (running_mean = 0.9 * 0 + 0.1 * [4, 5, 6]; running_var = 0.9 * 1 + 0.1 * 6.667, the unbiased batch variance)":
        "  (running_mean = 0.9 * 0 + 0.1 * [4, 5, 6]; running_var = 0.9 * 1 + 0.1 * 6.667, variansi batch "
        "tak bias)",
    "3. one sample s = [2, 2, 2], three paths (A = s,0,4,8; B = s,10,20,30):":
        "3. satu sampel s = [2, 2, 2], tiga jalur (A = s,0,4,8; B = s,10,20,30):",
    "train, in batch A": "train, di batch A", "train, in batch B": "train, di batch B",
    "eval, alone": "eval, sendirian", "eval, in batch B": "eval, di batch B", "eval identical?": "eval identik?",
    "4. eval mode on s2 = [2, 4, 6] (the layer trained on x1):":
        "4. mode eval pada s2 = [2, 4, 6] (layer yang sudah dilatih pada x1):",
    "eval output": "keluaran eval",
    "  after gamma = [2.0, 1.0, 0.5], beta = [10.0, 0.0, -10.0]:":
        "  setelah gamma = [2.0, 1.0, 0.5], beta = [10.0, 0.0, -10.0]:",
    "layer output": "keluaran layer", "match?": "cocok?",
    "max |normlab - torch.nn|:": "selisih maksimum |normlab - torch.nn|:",
    "gamma (weight)": "gamma (weight)", "beta (bias)": "beta (bias)", "eps": "eps", "momentum": "momentum",
    "running_mean": "running_mean", "running_var": "running_var",
    "(x - mu) / sqrt(var + eps)": "(x - mu) / sqrt(var + eps)", "manual g * x_hat + b": "manual g * x_hat + b",
    # shapes
    "LayerNorm(d_model) on [batch, seq_len, d_model] = [{b}, {t}, {d}]":
        "LayerNorm(d_model) pada [batch, seq_len, d_model] = [{b}, {t}, {d}]",
    "x = randn({b}, {t}, {d}) with seed {seed}; LayerNorm({d}, eps=1e-5)":
        "x = randn({b}, {t}, {d}) dengan seed {seed}; LayerNorm({d}, eps=1e-5)",
    "Input shape": "Bentuk input", "Output shape": "Bentuk output",
    "Gamma shape (weight)": "Bentuk gamma (weight)", "Beta shape (bias)": "Bentuk beta (bias)",
    "Output shape, sample {sample} alone": "Bentuk output, sampel {sample} sendirian",
    "max |row mean| of the output": "maks |rata-rata baris| output",
    "max |row std - 1| of the output": "maks |std baris - 1| output",
    "sample {sample}: batch size 1 == batch size {b}?": "sampel {sample}: ukuran batch 1 == ukuran batch {b}?",
    "  max abs difference": "  selisih mutlak maksimum",
    "normlab vs torch.nn on the whole batch: allclose(atol=1e-6) {ok}, max abs difference {diff}":
        "normlab vs torch.nn pada seluruh batch: allclose(atol=1e-6) {ok}, selisih mutlak maksimum {diff}",
    # compare
    "BatchNorm1d vs LayerNorm, measured on an ({n}, {d}) input":
        "BatchNorm1d vs LayerNorm, diukur pada input ({n}, {d})",
    "statistics axis (mean 0, var 1)": "sumbu statistik (rata-rata 0, variansi 1)",
    "output depends on batch mates (train)": "output bergantung pada teman satu batch (train)",
    "output depends on batch mates (eval)": "output bergantung pada teman satu batch (eval)",
    "works at batch size 1 (train)": "berjalan pada ukuran batch 1 (train)",
    "works at batch size 1 (eval)": "berjalan pada ukuran batch 1 (eval)",
    "keeps running statistics": "menyimpan statistik berjalan",
    "parameter shapes": "bentuk parameter", "typical use": "penggunaan umum",
    "dim 0 (per feature, over batch)": "dim 0 (per fitur, sepanjang batch)",
    "dim 1 (per sample, over features)": "dim 1 (per sampel, sepanjang fitur)",
    "neither axis": "bukan keduanya",
    "yes": "ya", "no": "tidak", "no ({error})": "tidak ({error})", "yes: {names}": "ya: {names}",
    "no buffers": "tanpa buffer", "buffers, not updated": "ada buffer, tidak diperbarui", "none": "tidak ada",
    "CNNs, batches of tens-hundreds": "CNN, batch berisi puluhan-ratusan sampel",
    "transformers, RNNs (sequences)": "transformer, RNN (sekuens)",
    "  {layer}: largest change of one sample's output when its batch mates are replaced: "
    "train {train}, eval {eval}":
        "  {layer}: perubahan terbesar output satu sampel ketika teman satu batch-nya diganti: "
        "train {train}, eval {eval}",
    "  {layer} at batch size 1 in {mode} mode raised {error}":
        "  {layer} pada ukuran batch 1 dalam mode {mode} memunculkan {error}",
    "torch.nn.BatchNorm1d and torch.nn.LayerNorm, probed the same way, give every cell the same.":
        "torch.nn.BatchNorm1d dan torch.nn.LayerNorm, diuji dengan cara yang sama, memberi isi yang sama "
        "di setiap sel.",
    "torch.nn differs:": "torch.nn berbeda:",
    "  {layer} / {row}: normlab {ours}, torch.nn {theirs}": "  {layer} / {row}: normlab {ours}, torch.nn {theirs}",
}


def say(lang: str, text: str, **fields) -> str:
    """``text`` in ``lang`` (``en``: as written; ``id``: its entry in ``ID``), formatted with ``fields``."""
    return (ID[text] if lang == "id" else text).format(**fields)


def check_lang(lang: str, command: str = "normlab demo") -> str:
    if lang not in LANGS:
        raise ValueError(f"{command}: expected --lang from {', '.join(LANGS)}, got {lang!r}")
    return lang


def add_lang_argument(p: argparse.ArgumentParser) -> None:
    p.add_argument("--lang", choices=LANGS, default="en",
                   help="language of the explanations: en (English, default) or id (Bahasa Indonesia); "
                        "the numbers do not change")
