"""``normlab._C``, the compiled "cpu" backend: found, checked against this torch and this CPU, loaded.

:func:`load` returns the module or None (a pure-Python install, ``NORMLAB_NO_EXTENSION=1``).
A library built for another torch, or for instructions this CPU lacks, is refused with an
``ImportError`` naming both sides and the command that rebuilds it -- before the library is
loaded, so that no instruction of it runs on a CPU that lacks it.
"""

from __future__ import annotations

import importlib.machinery
import json
from pathlib import Path
from typing import Optional

import torch

REBUILD = "pip install --no-build-isolation --force-reinstall --no-deps ."
_PACKAGE = Path(__file__).resolve().parent.parent
_module = None
_loaded = False


def _library() -> Optional[Path]:
    for suffix in importlib.machinery.EXTENSION_SUFFIXES:
        path = _PACKAGE / f"_C{suffix}"
        if path.exists():
            return path
    return None


def _cpu_flags() -> Optional[set]:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("flags"):
                return set(line.split(":", 1)[1].split())
    except OSError:
        pass
    return None  # not Linux: nothing to check against


def build_info() -> dict:
    """What the library was built for: ``{"torch": version, "level": "v4"|"v3"|"v1"|"",
    "cpu_flags": [...], "sanitize": bool}``; ``{}`` without a library."""
    path = _PACKAGE / "_C_build.json"
    return json.loads(path.read_text()) if path.exists() else {}


def check(info: dict, torch_version: str, cpu_flags: Optional[set]) -> None:
    """Raise ``ImportError`` when a library built as ``info`` cannot run beside ``torch_version``
    on a CPU with ``cpu_flags`` (None: unknown, not checked)."""
    built = info.get("torch")
    if built is not None and built != torch_version:
        raise ImportError(
            f"normlab: the C++ extension was built against torch {built}, but torch {torch_version} "
            f"is installed; rebuild it against this torch: {REBUILD}")
    missing = sorted(set(info.get("cpu_flags", [])) - cpu_flags) if cpu_flags is not None else []
    if missing:
        raise ImportError(
            f"normlab: the C++ extension was built for x86-64-{info.get('level')} and this CPU lacks "
            f"{', '.join(missing)}; rebuild it on this machine ({REBUILD}), or build for a lower level "
            f"with NORMLAB_CPU_LEVEL=v3 or v1")


def load():
    """The extension module, or None where the package was installed without it."""
    global _module, _loaded
    if not _loaded:
        _loaded = True
        if _library() is not None:
            check(build_info(), torch.__version__, _cpu_flags())
            import normlab._C as _C  # the compiled library: below every Python module
            _module = _C
    return _module


def available() -> bool:
    """Whether the "cpu" backend's library is installed (and loads)."""
    return load() is not None


def empty_like(x: torch.Tensor, memory_format=torch.preserve_format) -> torch.Tensor:
    """``torch.empty_like``, allocated as the kernels allocate their outputs: 4 MiB or more
    advised onto transparent huge pages (``csrc/cpu/huge_pages.h``)."""
    out = torch.empty_like(x, memory_format=memory_format)
    if out.is_cpu and load() is not None:
        _module.advise_huge_pages(out)
    return out


_SERVED = (torch.float32, torch.float64, torch.bfloat16, torch.float16)


def serves_cpu(x: torch.Tensor) -> bool:
    """Whether the "cpu" backend can run on ``x``: a CPU tensor of a float dtype it compiles for."""
    return x.device.type == "cpu" and x.dtype in _SERVED
