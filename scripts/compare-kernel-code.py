"""Whether the dispatched library's v4 kernels are the same machine code as a one-level build's.

    python scripts/compare-kernel-code.py OLD/_C.so NEW/_C.so [level]

OLD: a library built with the kernels compiled once (a NORMLAB_NATIVE=1 build, or a build from
before the levels); NEW: the dispatched one. For every function of NEW's copy at `level` (default
v4: its symbols name normlab_v4) found under the same name in OLD (normlab_v4 read as normlab),
the disassembly is compared instruction by instruction, with addresses, rip-relative
displacements and symbol annotations left out. Prints how many are identical."""

import difflib
import re
import subprocess
import sys


def functions(library: str, level: str = "") -> dict:
    out = subprocess.run(["objdump", "-d", "-C", "--no-show-raw-insn", library], check=True, capture_output=True,
                         text=True).stdout
    res, cur = {}, None
    for line in out.splitlines():
        m = re.match(r"^[0-9a-f]+ <(.+)>:$", line)
        if m:
            name = m.group(1)
            if level and f"normlab_{level}" not in name:
                cur = None
                continue
            cur = name.replace(f"normlab_{level}", "normlab") if level else name
            res[cur] = []
            continue
        if cur is not None and line.startswith(" ") and "\t" in line:
            ins = line.split("\t", 1)[1].strip()
            ins = re.sub(r"((?:j\w+|call)\s+)[0-9a-f]+\b.*$", r"\1T", ins)
            ins = re.sub(r"#.*$", "", ins)
            ins = re.sub(r"-?0x[0-9a-f]+\(%rip\)", "RIP", ins)
            res[cur].append(ins.strip())
    return res


def main(argv: list[str]) -> int:
    if len(argv) < 2:
        print(__doc__)
        return 2
    level = argv[2] if len(argv) > 2 else "v4"
    old, new = functions(argv[0]), functions(argv[1], level)
    same, differ, instructions = 0, [], 0
    for name, code in new.items():
        if name in old:
            instructions += len(code)
            if old[name] == code:
                same += 1
            else:
                differ.append(name)
    print(f"{level} kernel functions found in both: {same + len(differ)} ({instructions} instructions); "
          f"{same} identical, {len(differ)} differ")
    for name in differ[:5]:
        d = [x for x in difflib.unified_diff(old[name], new[name], lineterm="", n=0)
             if x.startswith(("+", "-")) and not x.startswith(("+++", "---"))]
        print(f"  {name[:100]}: {d[:4]}")
    return 0 if not differ else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
