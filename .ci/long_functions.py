#!/usr/bin/env python3
"""Lists functions over 120 lines in crates/*/src and files over 900 lines (STYLE limits). A
function may stay longer when the comment just above it says why it must stay whole (a line
with "stays whole"). Exits 1 when something is over a limit without that."""
import pathlib, re, sys

FN_MAX, FILE_MAX = 120, 900
bad = 0
for f in sorted(pathlib.Path("crates").glob("*/src/**/*.rs")):
    lines = f.read_text().split("\n")
    if len(lines) > FILE_MAX:
        print(f"{f}: {len(lines)} lines (at most {FILE_MAX})")
        bad += 1
    for i, l in enumerate(lines):
        m = re.match(r"^(\s*)(pub(\([a-z]+\))? )?(const |async |unsafe )*fn (\w+)", l)
        if not m:
            continue
        k = i
        while not re.search(r"[{;]\s*$", lines[k]):
            k += 1
        if lines[k].rstrip().endswith(";"):
            continue  # a declaration without a body
        ind = m.group(1)
        j = i
        while j < len(lines) and not (lines[j].startswith(ind + "}") and len(lines[j].rstrip()) == len(ind) + 1):
            j += 1
        n = j - i + 1
        if n > FN_MAX:
            above = "\n".join(lines[max(0, i - 6):i])
            if "stays whole" in above:
                continue
            print(f"{f}:{i + 1}: fn {m.group(5)} is {n} lines (at most {FN_MAX})")
            bad += 1
sys.exit(1 if bad else 0)
