"""Build normlab's C++ extension, ``normlab._C`` (the "cpu" backend), against the installed torch.

    pip install torch==2.13.0 && pip install --no-build-isolation .      # or: pip wheel ... -w dist

One library for every x86-64 CPU: the kernel files (``csrc/cpu/*_kernels.cpp``, found by a glob)
are compiled once per x86-64 level -- the baseline (v1), x86-64-v3 (AVX2, FMA, F16C) and
x86-64-v4 (AVX-512) -- each copy in its own namespace (``normlab_v1``, ``normlab_v3``,
``normlab_v4``: a generated wrapper file defines the macro ``normlab`` to the level's name and
includes the kernel file); everything else (schemas, autograd, bindings, the CPU entries) is
compiled once, for the baseline. The calls from the CPU entries into the kernels go through a
table of jumps (generated from the objects' symbols, ``levels_table.cpp``) that ``cpu/levels.cpp``
points at one level when the library loads: the best the CPU runs by cpuid/xgetbv, or the one
``NORMLAB_CPU_LEVEL=v1|v3|v4`` forces (docs/notes/issue-35-wheel-dispatch.md).
The baseline objects are linked first, so that every function the levels share (inline code of
the C++ library and of torch's headers) is kept in its baseline copy.

``NORMLAB_NATIVE=1``: one copy of the kernels for this machine (``-march=native``), no others; the
library refuses to load on a CPU without the build machine's instructions.
``NORMLAB_NO_EXTENSION=1``: the pure-Python package (backend "ref" only).
``NORMLAB_SANITIZE=1``: build with AddressSanitizer and UndefinedBehaviorSanitizer (docs/notes).
Floating point is compiled as written: no ``-ffast-math``, ``-ffp-contract=off``.
``_C_build.json`` beside the library records the torch version and the levels built.
"""

import glob
import json
import os
import platform
import re
import shutil
import subprocess
import sys

from setuptools import setup

HERE = os.path.dirname(os.path.abspath(__file__))
CSRC = os.path.join("src", "normlab", "csrc")
KERNELS = os.path.join(CSRC, "cpu", "*_kernels.cpp")  # compiled once per level

# level -> the compiler's -march for it (GCC >= 11 / Clang >= 12 know the x86-64-vN names)
X86_LEVELS = {"v1": "x86-64", "v3": "x86-64-v3", "v4": "x86-64-v4"}


def _fail(message: str) -> None:
    sys.stderr.write(f"\nnormlab: {message}\n\n")
    sys.exit(1)


def _cpu_flags() -> set:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("flags"):
                    return set(line.split(":", 1)[1].split())
    except OSError:
        pass
    return set()


def _levels() -> dict:
    """The levels to build: name -> extra compiler flags (the first one is the fallback)."""
    if os.environ.get("NORMLAB_NATIVE", "") == "1":
        return {"native": ["-march=native"]}
    if platform.machine().lower() not in ("x86_64", "amd64"):
        return {"default": []}  # other architectures: the compiler's default target, one copy
    return {name: [f"-march={march}"] for name, march in X86_LEVELS.items()}


def _nm(objects, *options) -> dict:
    """symbol -> nm's type letter (T, W: code; U: undefined; D, B, R, V: data)."""
    out = subprocess.run(["nm", "-P", *options, *objects], check=True, capture_output=True, text=True).stdout
    return {f[0]: f[1] for f in (line.split() for line in out.splitlines() if line and not line.endswith(":"))
            if len(f) >= 2}


def _table_source(shared_objects, level_objects: dict, names: list) -> str:
    """``levels_table.cpp``: a jump for each kernel function the shared objects call, through a
    slot that cpu/levels.cpp points at the chosen level's copy, and the levels' address tables."""
    called = set(_nm(shared_objects, "-u")) - set(_nm(shared_objects, "--defined-only"))
    if not level_objects:  # one copy, called directly: no jumps
        return "\n".join(['#include "cpu/levels.h"', 'extern "C" { void* normlab_level_slots[1] = {nullptr}; }',
                          "const int normlab::levels::kSlots = 0;",
                          f'const normlab::levels::Built normlab::levels::kBuilt[] = {{{{"{names[0]}", nullptr}}}};',
                          "const int normlab::levels::kNumBuilt = 1;", ""])
    defined = {lv: _nm(objs, "--defined-only", "-g") for lv, objs in level_objects.items()}
    mangled = {lv: f"{len('normlab_' + lv)}normlab_{lv}" for lv in names}
    slots = []
    for sym in sorted(called):
        if "7normlab" not in sym:
            continue
        per = {lv: re.sub(r"(?<!\d)7normlab", mangled[lv], sym) for lv in names}
        found = [lv for lv in names if per[lv] in defined[lv]]
        if not found:
            continue  # a shared function (huge_pages.cpp, ...)
        if len(found) != len(names):
            _fail(f"kernel symbol {sym} is built at {found} only")
        if any(defined[lv][per[lv]] not in "TtWi" for lv in names):
            _fail(f"{sym}: the files compiled once read this variable of a kernel file; the levels can only be "
                  "called (functions), so reach it through a function")
        slots.append((sym, per))
    # a level's calls to functions outside the kernel files (compiled once): jumps to them
    back = []
    for lv, objs in level_objects.items():
        for sym in sorted(set(_nm(objs, "-u")) - set(defined[lv])):
            if mangled[lv] in sym:
                back.append((sym, sym.replace(mangled[lv], "7normlab")))
    lines = ["// Generated by setup.py at build time: the kernels' jump table (cpu/levels.h).",
             '#include "cpu/levels.h"', "", "asm(R\"(",
             "  .section .data.rel.local,\"aw\"", "  .balign 8", "  .globl normlab_level_slots",
             "  .hidden normlab_level_slots", "normlab_level_slots:"]
    lines += [f"  .quad {per[names[0]]}" for _, per in slots] or ["  .quad 0"]
    for lv in names:
        lines += ["  .section .data.rel.ro.local,\"aw\"", "  .balign 8", f"  .globl normlab_level_table_{lv}",
                  f"  .hidden normlab_level_table_{lv}", f"normlab_level_table_{lv}:"]
        lines += [f"  .quad {per[lv]}" for _, per in slots] or ["  .quad 0"]
    lines.append("  .text")
    for i, (sym, _) in enumerate(slots):
        lines += [f"  .globl {sym}", f"  .hidden {sym}", f"  .type {sym}, @function", f"{sym}:",
                  f"  jmp *normlab_level_slots+{8 * i}(%rip)", f"  .size {sym}, .-{sym}"]
    for sym, target in back:
        lines += [f"  .globl {sym}", f"  .hidden {sym}", f"  .type {sym}, @function", f"{sym}:",
                  f"  jmp {target}", f"  .size {sym}, .-{sym}"]
    lines += [")\");", ""]
    for lv in names:
        lines.append(f'extern "C" void* const normlab_level_table_{lv}[];')
    lines.append(f"const int normlab::levels::kSlots = {len(slots)};")
    lines.append("const normlab::levels::Built normlab::levels::kBuilt[] = {")
    lines += [f'    {{"{lv}", normlab_level_table_{lv}}},' for lv in names]
    lines += ["};", f"const int normlab::levels::kNumBuilt = {len(names)};", ""]
    return "\n".join(lines)


def _extensions():
    if os.environ.get("NORMLAB_NO_EXTENSION", "") == "1":
        return [], {}
    try:
        import torch
        from torch.utils.cpp_extension import BuildExtension, CppExtension
    except ImportError:
        _fail("building the C++ extension needs torch installed first, and a build that sees it:\n"
              "    pip install torch==2.13.0 && pip install --no-build-isolation .\n"
              "(NORMLAB_NO_EXTENSION=1 installs the pure-Python package instead)")
    cxx = os.environ.get("CXX", "c++")
    if shutil.which(cxx) is None:
        _fail(f"no C++ compiler found (looked for {cxx!r}); install one (Debian/Ubuntu: "
              "apt-get install g++; Fedora: dnf install gcc-c++; macOS: xcode-select --install), "
              "or install the pure-Python package with NORMLAB_NO_EXTENSION=1")
    levels = _levels()
    # -g0: no debug information (Python's own flags ask for -g: a 22 MB library, a slower build)
    flags = ["-O3", "-g0", "-std=c++20", "-ffp-contract=off", "-fno-math-errno", "-fvisibility=hidden",
             "-Wno-c++20-extensions", "-Wno-maybe-uninitialized"]
    # torch's at::parallel_for is inline OpenMP where torch was built with it: without -fopenmp the
    # header's loop runs on one thread
    omp = ["-fopenmp"] if getattr(torch._C, "has_openmp", False) else []
    flags += omp
    link = []
    if os.environ.get("NORMLAB_SANITIZE", "") == "1":
        flags = [f for f in flags if f not in ("-O3", "-g0")] + ["-O1", "-g", "-fno-omit-frame-pointer",
                                                   "-fsanitize=address,undefined", "-fno-sanitize-recover=undefined"]
        link = ["-fsanitize=address,undefined"]
    native = "native" in levels
    info = {"torch": torch.__version__, "levels": list(levels), "level": "native" if native else "dispatch",
            "cpu_flags": sorted(_cpu_flags()) if native else [], "sanitize": bool(link)}
    kernels = sorted(glob.glob(KERNELS))
    shared = [s for s in sorted(glob.glob(os.path.join(CSRC, "**", "*.cpp"), recursive=True)) if s not in kernels]
    ext = CppExtension("normlab._C", shared + kernels, include_dirs=[os.path.join(HERE, CSRC)],
                       extra_compile_args=flags, extra_link_args=link + omp)

    class Build(BuildExtension):
        """Shared files once, kernel files once per level, the jump table; then ``_C_build.json``."""

        def build_extension(self, ext):
            compile_all = self.compiler.compile  # torch's (ninja) compile, set by build_extensions
            gen = os.path.abspath(os.path.join(self.build_temp, "normlab_levels"))
            wrappers = {}
            one = len(levels) == 1  # one copy: the kernel files as they are, in namespace normlab
            for lv in levels:
                if one:
                    wrappers[lv] = list(kernels)
                    continue
                os.makedirs(os.path.join(gen, lv), exist_ok=True)
                wrappers[lv] = []
                for k in kernels:
                    path = os.path.join(gen, lv, os.path.basename(k))
                    text = (f"// Generated by setup.py: {os.path.relpath(k, CSRC)} at level {lv}, in namespace "
                            f"normlab_{lv}.\n#define normlab normlab_{lv}\n#include \"{os.path.relpath(k, CSRC)}\"\n")
                    _write_if_changed(path, text)
                    wrappers[lv].append(path)

            def compile_levels(sources, output_dir=None, macros=None, include_dirs=None, debug=0,
                               extra_preargs=None, extra_postargs=None, depends=None):
                def run(srcs, extra):
                    post = extra_postargs
                    if isinstance(post, dict):
                        post = {**post, "cxx": list(post.get("cxx", [])) + extra}
                    else:
                        post = list(post or []) + extra
                    return compile_all(srcs, output_dir=output_dir, macros=macros, include_dirs=include_dirs,
                                       debug=debug, extra_preargs=extra_preargs, extra_postargs=post,
                                       depends=depends)
                first = next(iter(levels))
                base = levels[first]
                shared_objs = run([s for s in sources if s not in kernels], base)
                level_objs = {lv: run(wrappers[lv], levels[lv]) for lv in levels}
                table = os.path.join(gen, "levels_table.cpp")
                os.makedirs(gen, exist_ok=True)
                _write_if_changed(table, _table_source(shared_objs, {} if one else level_objs, list(levels)))
                table_objs = run([table], base)
                # baseline objects first: the linker keeps the first copy of a function the levels share
                return level_objs[first] + shared_objs + table_objs + [
                    o for lv in list(levels)[1:] for o in level_objs[lv]]

            self.compiler.compile = compile_levels
            try:
                super().build_extension(ext)
            finally:
                self.compiler.compile = compile_all

        def run(self):
            super().run()
            places = {os.path.dirname(self.get_ext_fullpath("normlab._C"))}
            if self.inplace or getattr(self, "editable_mode", False):  # the library sits in the source tree
                places.add(os.path.join(HERE, "src", "normlab"))
            for place in places:
                if os.path.isdir(place):
                    with open(os.path.join(place, "_C_build.json"), "w") as f:
                        json.dump(info, f)

    return [ext], {"build_ext": Build.with_options(use_ninja=shutil.which("ninja") is not None)}


def _write_if_changed(path: str, text: str) -> None:
    """Write ``text`` unless the file holds it already (an unchanged file keeps its time: no rebuild)."""
    try:
        with open(path) as f:
            if f.read() == text:
                return
    except OSError:
        pass
    with open(path, "w") as f:
        f.write(text)


ext_modules, cmdclass = _extensions()
setup(ext_modules=ext_modules, cmdclass=cmdclass)
