#!/usr/bin/env python3
"""Checks that every integration-test file of the workspace runs.

A crate whose Cargo.toml sets `autotests = false` links its integration tests as one binary,
`tests/main.rs`, that declares each file of `tests/` as a module (one binary instead of one per
file: each would link the whole engine again, in time and in disk). Cargo then no longer finds
a new `tests/*.rs` on its own, so a file left out of `tests/main.rs` would silently never run.
This script fails, naming the file and the fix, when a `tests/*.rs` is neither a module of a
declared test target nor a `[[test]]` target itself. Run by `.ci/run`; needs Python 3.11.
"""

import pathlib
import re
import sys
import tomllib

ROOT = pathlib.Path(__file__).resolve().parent.parent


def declared_modules(source: pathlib.Path) -> set[str]:
    """Names of the `mod NAME;` items at the top level of a test target's root file."""
    return set(re.findall(r"^mod (\w+);", source.read_text(), flags=re.M))


def main() -> int:
    problems = []
    checked = 0
    for manifest in sorted(ROOT.glob("crates/*/Cargo.toml")):
        crate = manifest.parent
        config = tomllib.loads(manifest.read_text())
        if config.get("package", {}).get("autotests", True):
            continue
        tests = crate / "tests"
        targets = [crate / t["path"] for t in config.get("test", [])]
        covered = {t.resolve() for t in targets}
        for target in targets:
            if not target.exists():
                problems.append(f"{manifest}: [[test]] path {target} does not exist")
                continue
            for name in declared_modules(target):
                covered.add((target.parent / f"{name}.rs").resolve())
        for file in sorted(tests.glob("*.rs")):
            checked += 1
            if file.resolve() not in covered:
                problems.append(
                    f"{file.relative_to(ROOT)} never runs: add `mod {file.stem};` to "
                    f"{(tests / 'main.rs').relative_to(ROOT)} (or a [[test]] target for it "
                    f"in {manifest.relative_to(ROOT)} if it needs a process of its own)"
                )
    for problem in problems:
        print(f"check-test-targets: {problem}", file=sys.stderr)
    if problems:
        return 1
    print(f"check-test-targets: {checked} test files, each in a test target")
    return 0


if __name__ == "__main__":
    sys.exit(main())
