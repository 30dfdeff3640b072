#!/usr/bin/env python3
"""Fails when the top-level modules of a crate import each other in a circle.

A module is a file `src/x.rs` or a directory `src/x/` (its files together); an edge a → b is a
`crate::b` path in a's files. A circle means neither can be read, changed or tested without the
other (ARCHITECTURE.md, "Architecture invariants")."""
import pathlib, re, sys

def modules(src):
    mods = {}
    for f in src.rglob("*.rs"):
        rel = f.relative_to(src).parts
        name = rel[0][:-3] if len(rel) == 1 else rel[0]
        if name in ("lib", "main"):
            continue
        mods.setdefault(name, []).append(f)
    return mods

def edges(mods):
    out = {}
    for m, files in mods.items():
        text = "\n".join(re.sub(r"//.*", "", f.read_text()) for f in files)
        deps = set()
        for path in re.findall(r"crate::([a-z_][a-z0-9_]*)", text):
            deps.add(path)
        for group in re.findall(r"use crate::\{([^}]*)\}", text):
            deps.update(re.findall(r"(?:^|,)\s*([a-z_][a-z0-9_]*)", group))
        out[m] = {d for d in deps if d in mods and d != m}
    return out

def cycles(g):
    found, state, stack = [], {}, []
    def visit(v):
        state[v] = 1
        stack.append(v)
        for w in sorted(g[v]):
            if state.get(w) == 1:
                found.append(stack[stack.index(w):] + [w])
            elif w not in state:
                visit(w)
        stack.pop()
        state[v] = 2
    for v in sorted(g):
        if v not in state:
            visit(v)
    return found

bad = 0
for src in sorted(pathlib.Path("crates").glob("*/src")):
    for c in cycles(edges(modules(src))):
        print(f"{src.parent.name}: import circle {' -> '.join(c)}")
        bad += 1
sys.exit(1 if bad else 0)
