#!/usr/bin/env python3
"""tests/layers.py — sift's rooms (top-level folders; main.c is a room of its own) and the
include graph between them, checked against one layer order (LAYERS, below; docs/layout.md).

Reads every `#include "..."` of the C, C++ and CUDA sources outside tests/, fuzz/, bench/ and
examples/, resolves it (from the including file's folder, then from the root) to the room of the
file it names, counts each room's non-blank lines, and prints a table: room, layer, files, lines,
share of all lines, the rooms it includes. `--dot` prints the graph for Graphviz instead
(`python3 tests/layers.py --dot | dot -Tsvg > layers.svg`).

Exits 1, one line per violation, when: a room holds more than a fifth of the lines; a room
includes a room of its own layer or of a higher one; rooms include each other in a circle; an
include names no file of the tree; a room is missing from LAYERS. `make test` runs it
(tests/run.sh), and tests/test_layers.py checks that each violation is reported.
Python 3, standard library only."""
import argparse
import os
import re
import sys

# Bottom to top. A room may include rooms of lower layers only; rooms of one layer are peers
# that include none of each other.
LAYERS = [
    ["simt"],                           # the CUDA runtime emulated on the CPU: imports nothing of sift's
    ["util"],                           # checked calls, fast exp, the CUDA launch/PTX wrappers
    ["weights"],                        # GGUF, dequantisation, safetensors + HF dirs, synthetic
    ["tok", "kv", "attn", "qgemm"],     # tokenizer; KV cache; attention kernels; quantised CPU GEMMs
    ["backend"],                        # the backend interface, CPU and CUDA backends, sampling
    ["model"],                          # config, loaders, the shared forward pass, cost
    ["policies"],                       # one file per strategy, the registry, the generation loop
    ["fit"],                            # fitting topk+phi's feature maps
    ["jobs", "eval"],                   # batch runner; eval suite
    ["cmd"],                            # the subcommands
    ["main.c"],                         # the CLI
]
MAX_SHARE = 0.20
SOURCE_EXT = (".c", ".h", ".cu", ".cuh", ".cpp", ".hpp", ".S")
NOT_ROOMS = {"tests", "fuzz", "bench", "examples", "build", "models"}
INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"', re.M)


def sources(root):
    """Paths (relative to root, '/'-separated) of the sources that belong to rooms."""
    out = []
    for top in sorted(os.listdir(root)):
        path = os.path.join(root, top)
        if top.startswith(".") or top in NOT_ROOMS:
            continue
        if os.path.isfile(path):
            if top.endswith(SOURCE_EXT):
                out.append(top)
            continue
        if os.path.islink(path):
            continue
        for d, dirs, files in os.walk(path):
            dirs.sort()
            for f in sorted(files):
                if f.endswith(SOURCE_EXT):
                    out.append(os.path.relpath(os.path.join(d, f), root).replace(os.sep, "/"))
    return out


def room_of(rel):
    return rel.split("/", 1)[0]


def resolve(root, rel, name):
    """The tree path an include names: from the including file's folder, then the root."""
    for base in (os.path.dirname(rel), ""):
        cand = os.path.normpath(os.path.join(base, name)).replace(os.sep, "/")
        if not cand.startswith("..") and os.path.isfile(os.path.join(root, cand)):
            return cand
    return None


def measure(root):
    """rooms: {room: {"files": n, "lines": n}}; edges: {(a, b): [(file, include), ...]};
    unresolved: [(file, include)]."""
    rooms, edges, unresolved = {}, {}, []
    for rel in sources(root):
        with open(os.path.join(root, rel), encoding="utf-8", errors="replace") as f:
            text = f.read()
        r = rooms.setdefault(room_of(rel), {"files": 0, "lines": 0})
        r["files"] += 1
        r["lines"] += sum(1 for line in text.splitlines() if line.strip())
        for name in INCLUDE.findall(text):
            target = resolve(root, rel, name)
            if target is None:
                unresolved.append((rel, name))
            elif room_of(target) != room_of(rel):
                edges.setdefault((room_of(rel), room_of(target)), []).append((rel, name))
    return rooms, edges, unresolved


def circles(nodes, edges):
    """Strongly connected components of more than one room (Tarjan), each sorted."""
    succ = {n: sorted(b for (a, b) in edges if a == n) for n in nodes}
    index, low, stack, on, out = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in succ.get(v, []):
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
                out.append(sorted(comp))

    for v in sorted(nodes):
        if v not in index:
            visit(v)
    return out


def violations(rooms, edges, unresolved):
    layer = {room: i for i, rs in enumerate(LAYERS) for room in rs}
    total = sum(r["lines"] for r in rooms.values()) or 1
    out = []
    for room in sorted(rooms):
        share = rooms[room]["lines"] / total
        if share > MAX_SHARE:
            out.append(f"oversized room: {room} holds {rooms[room]['lines']} of {total} lines "
                       f"({100 * share:.1f} % > {100 * MAX_SHARE:.0f} %)")
        if room not in layer:
            out.append(f"unknown room: {room} is in no layer of tests/layers.py's LAYERS")
    for (a, b), where in sorted(edges.items()):
        if a in layer and b in layer and layer[b] >= layer[a]:
            kind = "peer include" if layer[b] == layer[a] else "upward include"
            f, name = where[0]
            out.append(f"{kind}: {a} -> {b} ({f}: #include \"{name}\""
                       f"{f' and {len(where) - 1} more' if len(where) > 1 else ''})")
    for comp in circles(rooms.keys() | {b for (_, b) in edges}, edges):
        out.append(f"circle: {' <-> '.join(comp)} include each other")
    for f, name in unresolved:
        out.append(f"unresolved include: {f}: #include \"{name}\" names no file of the tree")
    return out


def table(rooms, edges):
    layer = {room: i for i, rs in enumerate(LAYERS) for room in rs}
    total = sum(r["lines"] for r in rooms.values()) or 1
    order = sorted(rooms, key=lambda r: (layer.get(r, len(LAYERS)), r))
    lines = [f"{'room':<10} {'layer':>5} {'files':>5} {'lines':>6} {'%':>5}  includes"]
    for r in order:
        inc = sorted((b for (a, b) in edges if a == r), key=lambda b: (layer.get(b, len(LAYERS)), b))
        lines.append(f"{r:<10} {layer.get(r, '?'):>5} {rooms[r]['files']:>5} {rooms[r]['lines']:>6} "
                     f"{100 * rooms[r]['lines'] / total:>5.1f}  {', '.join(inc)}")
    lines.append(f"{'total':<10} {'':>5} {sum(x['files'] for x in rooms.values()):>5} {total:>6}")
    return "\n".join(lines)


def dot(rooms, edges):
    layer = {room: i for i, rs in enumerate(LAYERS) for room in rs}
    total = sum(r["lines"] for r in rooms.values()) or 1
    out = ["digraph sift {", "  rankdir=BT; node [shape=box, fontname=Helvetica];"]
    for i, rs in enumerate(LAYERS):
        present = [r for r in rs if r in rooms]
        if present:
            out.append("  { rank=same; " + " ".join('"%s"' % r for r in present) + " }")
    for r in sorted(rooms):
        out.append(f"  \"{r}\" [label=\"{r}\\n{rooms[r]['lines']} lines, "
                   f"{100 * rooms[r]['lines'] / total:.0f} %\"];")
    for (a, b) in sorted(edges):
        bad = a in layer and b in layer and layer[b] >= layer[a]
        out.append(f"  \"{a}\" -> \"{b}\"{' [color=red]' if bad else ''};")
    out.append("}")
    return "\n".join(out)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--root", default=os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                    help="the tree to read (default: this repository)")
    ap.add_argument("--dot", action="store_true", help="print the graph for Graphviz")
    args = ap.parse_args(argv)
    rooms, edges, unresolved = measure(args.root)
    print(dot(rooms, edges) if args.dot else table(rooms, edges))
    bad = violations(rooms, edges, unresolved)
    for v in bad:
        print("layers: " + v, file=sys.stderr)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
