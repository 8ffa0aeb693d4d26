"""Build normlab's C++ extension, ``normlab._C`` (the "cpu" backend), against the installed torch.

    pip install torch==2.13.0 && pip install --no-build-isolation .

The extension is compiled for one x86-64 level, the build machine's best of x86-64-v4
(AVX-512), x86-64-v3 (AVX2, FMA, F16C) or the x86-64 baseline (``NORMLAB_CPU_LEVEL=v4|v3|v1``
chooses one); the level and the torch version go into ``_C_build.json`` beside the library, and
normlab refuses to load the library on a CPU without that level or beside another torch.
Floating point is compiled as written: no ``-ffast-math``, ``-ffp-contract=off``.

``NORMLAB_NO_EXTENSION=1``: the pure-Python package (backend "ref" only).
``NORMLAB_SANITIZE=1``: build with AddressSanitizer and UndefinedBehaviorSanitizer (docs/notes).
"""

import glob
import json
import os
import platform
import shutil
import sys

from setuptools import setup

HERE = os.path.dirname(os.path.abspath(__file__))
CSRC = os.path.join("src", "normlab", "csrc")

# the /proc/cpuinfo flags each level needs (GCC's -march=x86-64-v3 / -v4)
LEVELS = {
    "v4": ("x86-64-v4", ["avx", "avx2", "bmi1", "bmi2", "f16c", "fma", "abm", "movbe",
                          "avx512f", "avx512bw", "avx512cd", "avx512dq", "avx512vl"]),
    "v3": ("x86-64-v3", ["avx", "avx2", "bmi1", "bmi2", "f16c", "fma", "abm", "movbe"]),
    "v1": ("x86-64", []),
}


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


def _level() -> str:
    chosen = os.environ.get("NORMLAB_CPU_LEVEL", "").strip()
    if chosen:
        if chosen not in LEVELS:
            _fail(f"NORMLAB_CPU_LEVEL={chosen!r}: expected one of {sorted(LEVELS)}")
        return chosen
    if platform.machine().lower() not in ("x86_64", "amd64"):
        return ""  # other architectures: the compiler's default target
    flags = _cpu_flags()
    for name in ("v4", "v3"):
        if set(LEVELS[name][1]) <= flags:
            return name
    return "v1"


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
    level = _level()
    # -g0: no debug information (Python's own flags ask for -g: a 22 MB library, a slower build)
    flags = ["-O3", "-g0", "-std=c++20", "-ffp-contract=off", "-fno-math-errno", "-fvisibility=hidden",
             "-Wno-c++20-extensions", "-Wno-maybe-uninitialized"]
    # torch's at::parallel_for is inline OpenMP where torch was built with it: without -fopenmp the
    # header's loop runs on one thread
    omp = ["-fopenmp"] if getattr(torch._C, "has_openmp", False) else []
    flags += omp
    if level:
        flags.append(f"-march={LEVELS[level][0]}")
    link = []
    if os.environ.get("NORMLAB_SANITIZE", "") == "1":
        flags = [f for f in flags if f not in ("-O3", "-g0")] + ["-O1", "-g", "-fno-omit-frame-pointer",
                                                   "-fsanitize=address,undefined", "-fno-sanitize-recover=undefined"]
        link = ["-fsanitize=address,undefined"]
    info = {"torch": torch.__version__, "level": level, "cpu_flags": LEVELS[level][1] if level else [],
            "sanitize": bool(link)}
    sources = sorted(glob.glob(os.path.join(CSRC, "**", "*.cpp"), recursive=True))
    ext = CppExtension("normlab._C", sources, include_dirs=[os.path.join(HERE, CSRC)],
                       extra_compile_args=flags, extra_link_args=link + omp)

    class Build(BuildExtension):
        """The build, then ``_C_build.json`` beside the library: what it was built for."""

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


ext_modules, cmdclass = _extensions()
setup(ext_modules=ext_modules, cmdclass=cmdclass)
