"""``normlab._C``, the compiled "cpu" backend: found, checked against this torch and this CPU, loaded.

:func:`load` returns the module or None (a pure-Python install, ``NORMLAB_NO_EXTENSION=1``).
A library built for another torch is refused with an ``ImportError`` naming both versions and
the command that rebuilds it. The library holds the kernels once per x86-64 level (v1, v3, v4)
and binds, when it loads, the best one this CPU runs (``csrc/cpu/levels.h``);
``NORMLAB_CPU_LEVEL=v1|v3|v4`` forces one, and a level the CPU lacks is refused with an
``ImportError`` saying what it lacks (:func:`cpu_level` reports the choice). A one-copy build
(``NORMLAB_NATIVE=1``: ``-march=native``) is refused on a CPU without the build machine's
instructions -- before the library is loaded, so that no instruction of it runs there.
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
    """What the library was built for: ``{"torch": version, "level": "dispatch"|"native"|...,
    "levels": ["v1", "v3", "v4"], "cpu_flags": [...] (a native build's: the build machine's),
    "sanitize": bool}``; ``{}`` without a library."""
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
            f"normlab: the C++ extension was built for one machine's instructions "
            f"(level {info.get('level')!r}) and this CPU lacks {', '.join(missing)}; rebuild it on this "
            f"machine ({REBUILD}), without NORMLAB_NATIVE=1 for the build that runs on every x86-64 CPU")


def load():
    """The extension module, or None where the package was installed without it."""
    global _module, _loaded
    if not _loaded:
        _loaded = True
        if _library() is not None:
            check(build_info(), torch.__version__, _cpu_flags())
            import normlab._C as _C  # the compiled library: below every Python module
            error = _C.cpu_level()["error"] if hasattr(_C, "cpu_level") else ""
            if error:  # NORMLAB_CPU_LEVEL asked for a level this CPU (or this library) cannot run
                raise ImportError(f"normlab: {error}")
            _module = _C
    return _module


def cpu_level() -> Optional[dict]:
    """The kernels' x86-64 level bound in this process and why: ``{"level": "v4", "reason": ...,
    "cpu_runs": [levels this CPU runs], "built": [levels in the library], "vec_bytes": 64}``;
    None without the extension."""
    mod = load()
    if mod is None:
        return None
    info = dict(mod.cpu_level())
    info.pop("error", None)
    info["vec_bytes"] = int(mod.vec_bytes)
    return info


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
