#!/usr/bin/env python3
"""Fails when the top-level modules of a crate import each other in a circle, or when two
files of one folder (siblings: `tiered/store.rs` and `tiered/eviction.rs`) import each other.

A module is a file `src/x.rs` or a directory `src/x/` (its files together); an edge a → b is a
`crate::b` path in a's files. A circle means neither can be read, changed or tested without the
other (ARCHITECTURE.md, "Architecture invariants"). Between files, an edge is a `crate::…` or
`super::…` path naming the other file's module (`pub(super)` and `pub(crate)` are visibility,
not imports). A folder's `mod.rs` and a file in it are checked the same way: its relative paths
(`use store::BlockId`, a `pub use` re-export too) are its edges to its children, a child's
`super::…` path naming no sibling its edge back. Not yet a crate's `lib.rs` and its top-level
files (grinnder-cuda's `Cuda` is defined in `lib.rs` and its methods spread over them)."""
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

def file_modules(src):
    """Each file's module path: src/a/b.rs and src/a/b/mod.rs are ("a", "b"); lib.rs is ()."""
    out = {}
    for f in src.rglob("*.rs"):
        rel = list(f.relative_to(src).with_suffix("").parts)
        if rel[-1] in ("mod", "lib", "main"):
            rel = rel[:-1]
        out[tuple(rel)] = f
    return out

def file_edges(files):
    def longest(base, segs):
        parts = list(base)
        for seg in segs:
            if tuple(parts + [seg]) not in files:
                break
            parts.append(seg)
        return tuple(parts)
    out = {}
    for m, f in files.items():
        text = re.split(r"#\[cfg\(test\)\]\n(?:pub(?:\([a-z]+\))? )?mod tests", re.sub(r"//.*", "", f.read_text()))[0]
        own = m if f.name in ("mod.rs", "lib.rs", "main.rs") else m[:-1]  # the folder f is in
        deps = set()
        for p in re.findall(r"(?<!pub\()\bcrate((?:::[a-z_][a-z0-9_]*)+)", text):
            deps.add(longest((), p.strip(":").split("::")))
        for p in re.findall(r"(?<!pub\()(?<!in )\bsuper((?:::[a-z_][a-z0-9_*]*)*)", text):
            base = own[:-1] if f.name == "mod.rs" else own
            deps.add(longest(base, [x for x in p.strip(":").split("::") if x and x != "*"]))
        if f.name == "mod.rs":
            # a folder's own file names its children by relative paths (`use store::BlockId`,
            # `pub use cost::Prediction`: a re-export is an import too)
            for child in re.findall(r"^\s*(?:pub(?:\([a-z]+\))?\s+)?use\s+([a-z_][a-z0-9_]*)::", text, re.M):
                deps.add(longest(own, [child]))
        out[m] = {d for d in deps if d in files and d != m}
    return out

bad = 0
for src in sorted(pathlib.Path("crates").glob("*/src")):
    for c in cycles(edges(modules(src))):
        print(f"{src.parent.name}: import circle {' -> '.join(c)}")
        bad += 1
    files = file_modules(src)
    g = file_edges(files)
    for a in sorted(g):
        for b in sorted(g[a]):
            siblings = len(a) == len(b) and a[:-1] == b[:-1]
            # a folder's mod.rs and a file in it (`use super::*` both ways, once); not yet a
            # crate's lib.rs and its top-level files (cuda: six pairs)
            parent = (a == b[:-1] or b == a[:-1]) and min(len(a), len(b)) > 0
            if a < b and a in g.get(b, ()) and (siblings or parent):
                print(f"{src.parent.name}: {files[a]} and {files[b]} import each other")
                bad += 1
sys.exit(1 if bad else 0)
