#!/usr/bin/env python3
"""Holds the workspace's crate graph to the one ARCHITECTURE.md states.

ARCHITECTURE.md's "Crates" table lists, for every crate, the workspace crates it may depend on
(the last column: comma-separated names, or `none`). This script reads the dependencies each
crate declares (`cargo metadata --no-deps`, which reads the manifests only) and fails when:

- a crate declares a normal or build dependency on a workspace crate the table does not list
  for it (a new upward or sideways arrow), or the table lists one it does not declare (the
  document is false);
- a dev-dependency points upward: to a crate that itself depends, directly or through others,
  on the crate under test (tests may reach down or sideways, never up);
- the table names a crate the workspace does not have, or misses one it has;
- the allowed graph has a cycle.

Usage: python3 scripts/check-crate-deps.py [ARCHITECTURE.md]   (run from the workspace root)
"""
import json
import re
import subprocess
import sys
from pathlib import Path

PREFIX = "headroom-"
BINARY = "headroom"  # the `cli` crate's package name


def short(package):
    """The table's name for a workspace package."""
    if package == BINARY:
        return "cli"
    return package[len(PREFIX):] if package.startswith(PREFIX) else package


def stated_graph(text):
    """{crate: set of crates it may depend on}, from the table under `## Crates`."""
    section = text.split("\n## Crates", 1)
    if len(section) < 2:
        sys.exit("check-crate-deps: ARCHITECTURE.md has no '## Crates' section")
    graph = {}
    for line in section[1].split("\n## ", 1)[0].splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) < 3 or not re.fullmatch(r"`[a-z-]+`", cells[0]):
            continue
        deps = cells[-1].replace("`", "")
        names = set() if deps == "none" else {d.strip() for d in deps.split(",")}
        bad = [n for n in names if not re.fullmatch(r"[a-z-]+", n)]
        if bad:
            sys.exit(f"check-crate-deps: the 'depends on' cell of {cells[0]} must be crate "
                     f"names separated by commas, or none; found {deps!r}")
        graph[cells[0].strip("`")] = names
    if not graph:
        sys.exit("check-crate-deps: no crate rows found in ARCHITECTURE.md's '## Crates' table")
    return graph


def declared_graph():
    """{crate: (normal+build deps, dev deps)} on workspace crates, from the manifests."""
    meta = json.loads(subprocess.run(
        ["cargo", "metadata", "--format-version", "1", "--no-deps", "--offline"],
        check=True, capture_output=True, text=True).stdout)
    members = {p["name"] for p in meta["packages"]}
    graph = {}
    for p in meta["packages"]:
        normal, dev = set(), set()
        for d in p["dependencies"]:
            if d["name"] not in members:
                continue
            (dev if d["kind"] == "dev" else normal).add(short(d["name"]))
        graph[short(p["name"])] = (normal, dev)
    return graph


def reaches(graph, start, goal):
    """Whether `goal` is reachable from `start` along the allowed edges."""
    seen, todo = set(), [start]
    while todo:
        node = todo.pop()
        for nxt in graph.get(node, ()):
            if nxt == goal:
                return True
            if nxt not in seen:
                seen.add(nxt)
                todo.append(nxt)
    return False


def main():
    doc = Path(sys.argv[1] if len(sys.argv) > 1 else "ARCHITECTURE.md")
    stated = stated_graph(doc.read_text())
    declared = declared_graph()
    errors = []
    for name in sorted(set(declared) - set(stated)):
        errors.append(f"crate `{name}` is in the workspace but not in {doc}'s Crates table")
    for name in sorted(set(stated) - set(declared)):
        errors.append(f"{doc} lists crate `{name}`, which the workspace does not have")
    for name in sorted(set(stated) & set(declared)):
        normal, dev = declared[name]
        for extra in sorted(normal - stated[name]):
            errors.append(f"`{name}` depends on `{extra}`, an arrow {doc} does not allow: "
                          f"remove the dependency, or change the design and the table together")
        for missing in sorted(stated[name] - normal):
            errors.append(f"{doc} says `{name}` depends on `{missing}`, but it does not: "
                          f"correct the table")
        for target in sorted(dev):
            if target == name or reaches(stated, target, name):
                errors.append(f"`{name}` has a dev-dependency on `{target}`, which depends on "
                              f"`{name}`: tests may not reach up the graph")
    for name in stated:
        if reaches(stated, name, name):
            errors.append(f"{doc}'s crate graph has a cycle through `{name}`")
    if errors:
        print("crate dependency rules broken:", *errors, sep="\n  ", file=sys.stderr)
        sys.exit(1)
    print(f"crate dependencies: {sum(len(v) for v in stated.values())} arrows of "
          f"{len(stated)} crates as {doc} states")


if __name__ == "__main__":
    main()
