#!/usr/bin/env python3
"""The layers check: no crate of the workspace leans on a heavy crate it should not, and no two
sibling modules of a crate (at any depth) use each other, directly or round a loop.

    scripts/layers.py            check; exit 1 with what is wrong
    scripts/layers.py --graph    print each crate's module graph

A module uses its sibling when its code (tests aside) names it by a path: `crate::a::b`,
`super::b`, `self::b`, in a `use` group or inline; `a::b::c` using `a::d` is an edge b -> d of
module a. Cycles that are older than this check are listed in KNOWN below, edge by edge; the list
may only shrink: a new edge inside a cycle fails the check, and so does a listed edge that no
longer exists (delete it from KNOWN).
"""
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

# crate directory -> crates its normal dependency tree must not hold.
HEAVY = ["candle-core", "ort", "axum", "webrtc", "cpal", "clap", "reqwest", "rmcp", "tokio-tungstenite"]
# The engines are models only: no server, network, device or command line in their tree.
NETWORKS = ["axum", "webrtc", "cpal", "clap", "reqwest", "rmcp", "tokio-tungstenite"]
# The services talk to providers (reqwest, tokio-tungstenite) over the engines: no server,
# WebRTC, device, command line or MCP client in their tree.
SERVING = ["axum", "webrtc", "cpal", "clap", "rmcp"]
# The media and the load tester carry audio over the network: no server, command line or MCP
# client in their tree.
MEDIA = ["axum", "clap", "rmcp"]
# A bot is what a program embedding voxide depends on: no server, command line, WebRTC peer or
# sound card in its tree (the media's `webrtc` and `local` features stay off).
BOT = ["axum", "clap", "webrtc", "cpal"]
# The benchmarks and the providers' stand-ins (HTTP servers themselves): no command line.
BENCH = ["clap"]
LEAN = {"crates/voxide-core": HEAVY, "crates/voxide-engines": NETWORKS,
        "crates/voxide-services": SERVING, "crates/voxide-media": MEDIA,
        "crates/voxide-loadtest": MEDIA, "crates/voxide-bot": BOT,
        "crates/voxide-bench": BENCH}

# Edges inside cycles that predate the check (crate dir, parent module, from, to), to be cut
# one by one. The last, the load tester's session, link and call, went with its own crate.
KNOWN: set[tuple[str, str, str, str]] = set()


def module_path(src: Path, f: Path) -> list[str]:
    """The module a file holds: src/a/b.rs and src/a/b/mod.rs are both a::b."""
    parts = list(f.relative_to(src).with_suffix("").parts)
    if parts[-1] in ("mod", "lib", "main"):
        parts.pop()
    return parts


PATH = re.compile(r"\b(crate|super|self)((?:::(?:[A-Za-z_][A-Za-z0-9_]*|\{[^{}]*(?:\{[^{}]*\}[^{}]*)*\}))+)")


def expand(tail: str) -> list[list[str]]:
    """`::a::{b, c::d}` as [[a, b], [a, c, d]]: each path's segments (lower-case ones)."""
    m = re.match(r"::([A-Za-z_][A-Za-z0-9_]*)(.*)", tail, re.S)
    if m:
        rest = expand(m.group(2)) if m.group(2) else [[]]
        return [[m.group(1)] + r for r in rest]
    m = re.match(r"::\{(.*)\}", tail, re.S)
    if not m:
        return [[]]
    out, depth, item = [], 0, ""
    for ch in m.group(1) + ",":
        if ch == "," and depth == 0:
            item = item.strip()
            if item:
                head, _, more = item.partition("::")
                out += [[head] + r for r in (expand("::" + more) if more else [[]])]
            item = ""
            continue
        depth += ch == "{"
        depth -= ch == "}"
        item += ch
    return out


def graph(src: Path) -> dict[tuple[str, ...], set[str]]:
    """Each module with children (keyed by its path) -> edges between its children, as
    "a>b" strings: child a's code names child b."""
    files = [f for f in src.rglob("*.rs")]
    known = {tuple(module_path(src, f)) for f in files}
    # A module's ancestors exist too (a folder without mod.rs is not used here).
    edges: dict[tuple[str, ...], set[str]] = {}
    for f in files:
        here = module_path(src, f)
        text = f.read_text()
        # Tests live below `#[cfg(test)]`: they are not part of the layering.
        text = text.split("#[cfg(test)]")[0]
        text = "\n".join(l for l in text.splitlines() if not l.lstrip().startswith("//"))
        for root, tail in PATH.findall(text):
            base = {"crate": [], "super": here[:-1], "self": here}[root]
            for segs in expand(tail):
                while segs and segs[0] == "super":
                    base, segs = base[:-1], segs[1:]
                target = base + [s for s in segs if s and s[0].islower()]
                # The longest prefix that is a module.
                while target and tuple(target) not in known:
                    target.pop()
                common = 0
                while common < min(len(here), len(target)) and here[common] == target[common]:
                    common += 1
                if common < len(here) and common < len(target):
                    parent = tuple(here[:common])
                    edges.setdefault(parent, set()).add(f"{here[common]}>{target[common]}")
    return edges


def cyclic_edges(pairs: set[str]) -> set[tuple[str, str]]:
    """Edges whose ends lie in one strongly connected component (Tarjan)."""
    edges: dict[str, set[str]] = {}
    for p in pairs:
        a, b = p.split(">")
        edges.setdefault(a, set()).add(b)
        edges.setdefault(b, set())
    index, low, stack, on, comp, counter = {}, {}, [], set(), {}, [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in edges[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            while True:
                w = stack.pop()
                on.discard(w)
                comp[w] = v
                if w == v:
                    break

    for v in edges:
        if v not in index:
            visit(v)
    return {(a, b) for a in edges for b in edges[a] if comp[a] == comp[b]}


def crates() -> list[str]:
    dirs = ["."]
    dirs += sorted(str(p.parent.relative_to(ROOT)) for p in ROOT.glob("crates/*/Cargo.toml"))
    return dirs


def main() -> int:
    problems = []
    for crate in crates():
        for parent, pairs in sorted(graph(ROOT / crate / "src").items()):
            where = "::".join(parent) or "crate"
            if "--graph" in sys.argv:
                print(f"{crate} {where}: {' '.join(sorted(pairs))}")
            found = {(crate, where, a, b) for a, b in cyclic_edges(pairs)}
            for edge in sorted(found - KNOWN):
                problems.append(f"{crate} {where}: {edge[2]} uses {edge[3]}, and {edge[3]} leads back to it")
            for edge in sorted(k for k in KNOWN if k[:2] == (crate, where) and k not in found):
                problems.append(f"{crate} {where}: {edge[2]} -> {edge[3]} is in no cycle now: delete it from KNOWN")
    for crate, banned in LEAN.items():
        name = Path(crate).name
        tree = subprocess.run(
            ["cargo", "tree", "-p", name, "-e", "normal", "--prefix", "none", "--locked"],
            cwd=ROOT, capture_output=True, text=True, check=True,
        ).stdout
        held = sorted({line.split()[0] for line in tree.splitlines() if line.split()} & set(banned))
        if held:
            problems.append(f"{name} depends on {', '.join(held)}")
    for p in problems:
        print(f"layers: {p}", file=sys.stderr)
    if not problems:
        print(f"layers: {len(crates())} crates, no new module cycle, the lean crates stay lean")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
