#!/usr/bin/env python3
"""Prints the import cycles between the source files of each crate of the workspace (the
relay's src/ and every crates/*/src): what the compiler cannot see. Between crates the
compiler holds the layering (a crate cannot name one above it); inside a crate any module may
name any other, and this script keeps that graph one-way.

Every path a file names (`use crate::a::b`, `super::x`, `crate::a::f(...)` in code) is resolved
to the longest module prefix that is a file of the same crate, giving an edge file -> file.
Comments are skipped and string and char literals emptied first, in one pass, so a `//` in a
string is not a comment. Declaring a child (`mod x;`) is not an edge; using its items is. Unit
tests (inline `#[cfg(test)] mod ... { }`, or files named tests.rs / *_tests.rs) may import
anything and are left out. Cycles are the strongly connected components of more than one file.
`--modules` folds files into their top-level module (crate::a) first.

Exit status 1 when a cycle exists that ALLOWED does not name, or when ALLOWED names one that is
gone (so the list only shrinks).
"""
import os
import re
import sys

REPO = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

# Cycles kept on purpose, each with why: (crate source root, files) -> reason. None is kept
# now; an entry needs a reason a reviewer accepts, and is removed once its cycle is gone.
ALLOWED = {}


def crate_roots():
    roots = ["src"]
    crates = os.path.join(REPO, "crates")
    if os.path.isdir(crates):
        roots += sorted(
            os.path.join("crates", c, "src")
            for c in os.listdir(crates)
            if os.path.isdir(os.path.join(crates, c, "src"))
        )
    return roots


def module_of(rel):
    parts = rel[:-3].split(os.sep)
    if parts[-1] in ("mod", "lib", "main"):
        parts = parts[:-1]
    return tuple(parts)


RAW_OPEN = re.compile(r'r(#*)"')
# `r"` opens a raw string unless a word ends just before it (`br"` does: b is a prefix).
WORD_BEFORE_RAW = re.compile(r"[A-Za-ac-z0-9_]")
CHAR_LITERAL = re.compile(r"'(?:\\.[^']*|[^'\\])'")


def strip(text):
    """The code without comments and with every string and char literal emptied, read in one
    pass from the start: a `//` inside a string (a URL) is not a comment, and a quote inside a
    comment opens no string."""
    out, i, n = [], 0, len(text)
    while i < n:
        c = text[i]
        if text.startswith("//", i):
            j = text.find("\n", i)
            i = n if j < 0 else j
        elif text.startswith("/*", i):
            depth, i = 1, i + 2
            while i < n and depth:
                if text.startswith("/*", i):
                    depth, i = depth + 1, i + 2
                elif text.startswith("*/", i):
                    depth, i = depth - 1, i + 2
                else:
                    i += 1
        elif c == "r" and RAW_OPEN.match(text, i) and not WORD_BEFORE_RAW.match(text, max(i - 1, 0), i):
            hashes = RAW_OPEN.match(text, i).group(1)
            end = text.find('"' + hashes, i + 2 + len(hashes))
            out.append('""')
            i = n if end < 0 else end + 1 + len(hashes)
        elif c == '"':
            i += 1
            while i < n and text[i] != '"':
                i += 2 if text[i] == "\\" else 1
            out.append('""')
            i += 1
        elif c == "'" and CHAR_LITERAL.match(text, i):
            # A char literal ('a', '\n', '\u{1F600}'); a lifetime ('a) has no closing quote.
            i = CHAR_LITERAL.match(text, i).end()
            out.append("' '")
        else:
            out.append(c)
            i += 1
    return "".join(out)


def without_tests(text):
    # `#[cfg(test)] mod tests { ... }` may import anything: tests are not part of the graph.
    out, i = [], 0
    for m in re.finditer(r"#\[cfg\(test\)\]\s*(?:pub(?:\([^)]*\))?\s+)?mod\s+\w+\s*\{", text):
        if m.start() < i:
            continue
        out.append(text[i : m.start()])
        depth, j = 1, m.end()
        while j < len(text) and depth:
            depth += {"{": 1, "}": -1}.get(text[j], 0)
            j += 1
        i = j
    out.append(text[i:])
    return "".join(out)


def expand_use(tree):
    """`a::{b, c::{d, e}}` -> [a::b, a::c::d, a::c::e]."""
    tree = re.sub(r"\s+", "", tree)
    depth, split = 0, None
    for k, ch in enumerate(tree):
        if ch == "{":
            if depth == 0 and split is None:
                split = k
            depth += 1
        elif ch == "}":
            depth -= 1
    if split is None:
        return [tree.split(" as ")[0]] if tree else []
    prefix, inner = tree[:split], tree[split + 1 : tree.rindex("}")]
    items, depth, cur = [], 0, ""
    for ch in inner:
        if ch == "," and depth == 0:
            items.append(cur)
            cur = ""
            continue
        depth += {"{": 1, "}": -1}.get(ch, 0)
        cur += ch
    items.append(cur)
    paths = []
    for item in items:
        for sub in expand_use(item):
            paths.append(prefix + sub if sub != "self" else prefix.rstrip(":"))
    return paths


def cycles_of(root_rel, fold):
    """The cycles among the files (or, with `fold`, top-level modules) of one crate."""
    SRC = os.path.join(REPO, root_rel)
    files = {}
    for root, _, names in os.walk(SRC):
        for name in names:
            if name.endswith(".rs"):
                rel = os.path.relpath(os.path.join(root, name), SRC)
                if rel in ("main.rs",) or rel.startswith("bin" + os.sep):
                    continue
                # Unit tests in files of their own (`#[cfg(test)] mod tests;`): like inline
                # test modules, they may import anything and are not part of the graph.
                if name == "tests.rs" or name.endswith("_tests.rs") or (os.sep + "tests" + os.sep) in (os.sep + rel):
                    continue
                files[module_of(rel)] = rel
    edges = {rel: set() for rel in files.values()}

    def resolve(here, path):
        segs = [s for s in path.split("::") if s]
        if not segs:
            return None
        if segs[0] == "crate":
            base, segs = (), segs[1:]
        elif segs[0] in ("super", "self"):
            base = here
            while segs and segs[0] in ("super", "self"):
                if segs[0] == "super":
                    base = base[:-1]
                segs = segs[1:]
        else:
            # A path relative to this module: a child declared here (or an external crate).
            base = here
            if base + (segs[0],) not in files:
                return None
        best = None
        for n in range(len(segs) + 1):
            cand = base + tuple(segs[:n])
            if cand in files:
                best = cand
        return best

    for mod, rel in files.items():
        text = without_tests(strip(open(os.path.join(SRC, rel)).read()))
        # A file's own module for `self::`/relative paths; `mod.rs` and `lib.rs` are their dir.
        paths = []
        for m in re.finditer(r"\buse\s+([^;]+);", text):
            paths += expand_use(m.group(1))
        paths += re.findall(r"\b((?:crate|super)(?:::\w+)+)", text)
        # `child::item(...)` in code, without a `use`: relative to this module (resolve keeps
        # only paths whose first segment is a child declared here).
        paths += re.findall(r"(?<![:\w])(\w+(?:::\w+)+)", text)
        for p in paths:
            target = resolve(mod, p)
            if target is None or target == mod:
                continue
            # A parent naming its own child is declaration plus re-export: counted (it is an
            # import); a child naming its parent too. Both directions make a cycle.
            edges[rel].add(files[target])

    if fold:
        def top(rel):
            m = module_of(rel)
            return m[0] if m else "lib"
        folded = {}
        for a, bs in edges.items():
            folded.setdefault(top(a), set())
            for b in bs:
                if top(b) != top(a) and top(a) != "lib" and top(b) != "lib":
                    folded[top(a)].add(top(b))
        edges = folded

    # Tarjan's strongly connected components.
    index, low, stack, on, sccs, counter = {}, {}, [], set(), [], [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in edges.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                sccs.append(sorted(comp))

    sys.setrecursionlimit(10000)
    for v in sorted(edges):
        if v not in index:
            visit(v)
    return [(comp, edges) for comp in sccs]


def main():
    fold = "--modules" in sys.argv
    failed = False
    seen = set()
    for root in crate_roots():
        for comp, edges in cycles_of(root, fold):
            members = frozenset(comp)
            allowed = None if fold else ALLOWED.get((root, members))
            seen.add((root, members))
            print(f"{root}: cycle of {len(comp)}" + (f" (allowed: {allowed})" if allowed else ":"))
            for a in comp:
                inside = sorted(b for b in edges[a] if b in members)
                print(f"  {a} -> {', '.join(inside)}")
            failed |= allowed is None
    if not fold:
        for (root, members), why in ALLOWED.items():
            if (root, members) not in seen:
                print(f"{root}: the allowed cycle {sorted(members)} is gone: remove it from ALLOWED")
                failed = True
    if not failed:
        print("no import cycle" + (" outside ALLOWED" if seen and not fold else ""))
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
