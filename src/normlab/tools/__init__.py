"""normlab.tools: model-level tools for a normalization layer's whole life.

- :func:`freeze_batch_norm` / :func:`unfreeze_batch_norm`: BatchNorm layers that compute
  the eval formula in every mode (``freezing.py``).
- :func:`recalibrate_batch_norm`: running statistics recomputed exactly over a set of
  batches (``recalibration.py``).
- :func:`fold`: an inference copy with BatchNorm folded into the layer before it,
  LayerNorm/RMSNorm affines into the Linear after them and LayerNorm2d affines into the
  1x1 Conv2d after them (``folding.py``).
- :func:`inspect`: every norm layer's statistics, measured batch dependence, running-statistics
  health and pitfalls, as a table (``inspection.py``; also ``normlab inspect``).
- ``hf.py``, ``timm.py``: Hugging Face transformers' and timm's norm classes for
  ``normlab.convert``, imported when convert first meets one (``integrations.py``
  registers the finders).

The four tools take BatchRenorm and GhostBatchNorm as BatchNorm (their eval is BatchNorm's).
"""

from . import integrations  # noqa: F401  (convert's lazy finders for other libraries' norm classes)
from .freezing import freeze_batch_norm, unfreeze_batch_norm
from .folding import FoldReport, fold
from .inspection import InspectReport, inspect
from .recalibration import recalibrate_batch_norm

__all__ = ["freeze_batch_norm", "unfreeze_batch_norm", "recalibrate_batch_norm", "fold", "FoldReport",
           "inspect", "InspectReport"]
