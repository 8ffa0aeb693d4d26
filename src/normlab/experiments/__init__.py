"""normlab.experiments: the chapters' experiments, done properly.

A module per study (``stability``, ``batch_size``, ``train_eval``), one results store
(``store``: SQLite, resumable), one report (``report``). Each study is a user of the
library: its models are built from ``normlab.nn``. The command line runs them as
``normlab experiment NAME`` and ``normlab report``.
"""
