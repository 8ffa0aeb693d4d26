#!/usr/bin/env python3
"""Check that normlab's dispatched library runs on a baseline x86-64 CPU until it binds a level.

Every function of ``normlab/_C*.so`` outside the v3 and v4 copies of the kernels (whose symbols
name ``normlab_v3`` / ``normlab_v4``: the functions, their lambdas, OpenMP bodies and template
instances) must be free of instructions a baseline x86-64 CPU lacks: VEX/EVEX encodings (every
``v...`` mnemonic, ymm/zmm and mask registers) and BMI/LZCNT/MOVBE/POPCNT. That covers what runs at
load (static initialisers, the level choice, the jump table) and the schemas, autograd and
bindings, and the baseline copy. The linker keeps the first copy of a function the levels share
(inline code of the C++ library and of torch's headers) and setup.py links the baseline objects
first: a v3/v4 copy kept by mistake shows here, as a shared function with AVX in it. The
compiler's local clones (``.constprop``, ``.isra``, ``.part``, ``.cold``) are private to the object
they were made in, so a level object's clone runs only under its level: they are not counted.

    python scripts/check-isa.py [path/to/_C.so]     # exit 1 and the offenders when any
"""

from __future__ import annotations

import glob
import os
import re
import subprocess
import sys

LEVEL_COPIES = ("10normlab_v3", "10normlab_v4")
# Clones the compiler makes of a function for one object (constant arguments propagated, a part
# split off): local symbols, callable only from the object they were made in -- a v3/v4 object's
# clone of a library function (std::vector's constructor) runs only under its level.
LOCAL_CLONE = re.compile(r"\.(constprop|isra|part|cold)\.\d+$")
BEYOND_BASELINE = {"andn", "bextr", "blsi", "blsmsk", "blsr", "bzhi", "mulx", "pdep", "pext", "rorx", "sarx",
                   "shlx", "shrx", "lzcnt", "movbe", "popcnt", "crc32"}
REGS = re.compile(r"%(ymm|zmm)\d+|%k[0-7]\b")


def local_functions(library: str) -> set:
    """Names of the library's local (object-private) function symbols."""
    out = subprocess.run(["nm", library], check=True, capture_output=True, text=True).stdout
    return {parts[2] for parts in (line.split() for line in out.splitlines()) if len(parts) == 3 and parts[1] == "t"}


def offenders(library: str) -> dict:
    out = subprocess.run(["objdump", "-d", "--no-show-raw-insn", "-M", "att", library], check=True,
                         capture_output=True, text=True).stdout
    local = local_functions(library)
    bad: dict = {}
    func = ""
    for line in out.splitlines():
        m = re.match(r"^[0-9a-f]+ <(.+)>:$", line)
        if m:
            func = m.group(1)
            continue
        if not line.startswith(" ") or any(c in func for c in LEVEL_COPIES):
            continue
        if LOCAL_CLONE.search(func) and func in local:
            continue
        parts = line.split("\t")
        if len(parts) < 2:
            continue
        insn = parts[1].strip()
        mnemonic = insn.split()[0] if insn else ""
        if (mnemonic.startswith("v") and mnemonic not in ("verr", "verw")) or mnemonic in BEYOND_BASELINE \
                or (mnemonic.startswith("k") and REGS.search(insn)) or REGS.search(insn):
            bad.setdefault(func, []).append(insn)
    return bad


def main(argv: list[str]) -> int:
    if argv:
        library = argv[0]
    else:
        here = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "src", "normlab")
        found = sorted(glob.glob(os.path.join(here, "_C*.so")))
        if not found:
            print("check-isa: no normlab/_C*.so; build it first (python setup.py build_ext --inplace)")
            return 2
        library = found[0]
    bad = offenders(library)
    if not bad:
        print(f"check-isa: {library}: every function outside the v3/v4 kernel copies is baseline x86-64")
        return 0
    print(f"check-isa: {library}: {len(bad)} functions outside the v3/v4 kernel copies use instructions "
          "beyond baseline x86-64:")
    for func, insns in sorted(bad.items()):
        print(f"  {func}: {len(insns)} such, e.g. {insns[0]}")
    return 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
