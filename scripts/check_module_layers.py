#!/usr/bin/env python3
"""Fails when a module of src/ includes a module it may not (src/MODULES).

Every `#include "dir/..."` of src/**/*.{h,cc,cu,cuh} names a module (the
longest module directory its path starts with); that module must be the
including file's own or one listed for it in the table. The table itself must
be acyclic and name only known modules.

  scripts/check_module_layers.py                       # this repository
  scripts/check_module_layers.py --src DIR --modules FILE  # another tree (tests)

Exit status: 0 when every include looks down, 1 with one line per violation.
Standard library only.
"""
import argparse
import pathlib
import re
import sys

INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"')
SOURCE_SUFFIXES = {".h", ".cc", ".cu", ".cuh"}


def read_table(path):
    """module -> set of modules it may include, in file order."""
    table = {}
    for number, raw in enumerate(path.read_text().splitlines(), 1):
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        if ":" not in line:
            raise ValueError(f"{path}:{number}: expected 'module: deps...', got {raw!r}")
        module, deps = line.split(":", 1)
        module = module.strip()
        if module in table:
            raise ValueError(f"{path}:{number}: module {module} listed twice")
        table[module] = set(deps.split())
    return table


def table_errors(table, path):
    errors = []
    for module, deps in table.items():
        for dep in sorted(deps - table.keys()):
            errors.append(f"{path}: {module} may include {dep}, which is not a module")
        if module in deps:
            errors.append(f"{path}: {module} lists itself")
    # Depth-first search for a cycle (a module that could include itself through others).
    state = {}

    def visit(module, stack):
        state[module] = "open"
        for dep in sorted(table.get(module, ())):
            if dep not in table or dep == module:
                continue
            if state.get(dep) == "open":
                cycle = stack[stack.index(dep):] + [dep]
                errors.append(f"{path}: cycle {' -> '.join(cycle)}")
            elif dep not in state:
                visit(dep, stack + [dep])
        state[module] = "done"

    for module in table:
        if module not in state:
            visit(module, [module])
    return errors


def module_of(relative_dir, directories):
    """The module whose directory is the longest prefix of relative_dir (a posix path), or None."""
    best = None
    for module, directory in directories.items():
        if relative_dir == directory or relative_dir.startswith(directory + "/"):
            if best is None or len(directory) > len(directories[best]):
                best = module
    return best


def check(src, table):
    directories = {module: module.replace("_", "/") for module in table}
    errors = []
    for path in sorted(src.rglob("*")):
        if path.suffix not in SOURCE_SUFFIXES or not path.is_file():
            continue
        relative = path.relative_to(src).as_posix()
        module = module_of(relative.rsplit("/", 1)[0] if "/" in relative else "", directories)
        if module is None:
            errors.append(f"{src.name}/{relative}: not inside any module of the table")
            continue
        for number, line in enumerate(path.read_text(errors="replace").splitlines(), 1):
            match = INCLUDE.match(line)
            if not match or "/" not in match.group(1):
                continue
            included = match.group(1)
            target = module_of(included.rsplit("/", 1)[0], directories)
            where = f"{src.name}/{relative}:{number}"
            if target is None:
                errors.append(f"{where}: includes \"{included}\", which is in no module")
            elif target != module and target not in table[module]:
                allowed = " ".join(sorted(table[module])) or "(nothing)"
                errors.append(f"{where}: {module} includes \"{included}\" of module {target}; "
                              f"{module} may include only: {allowed} (src/MODULES)")
    return errors


def main():
    root = pathlib.Path(__file__).resolve().parent.parent
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--src", type=pathlib.Path, default=root / "src", help="source tree (default: src/)")
    parser.add_argument("--modules", type=pathlib.Path, help="dependency table (default: SRC/MODULES)")
    args = parser.parse_args()
    modules = args.modules or args.src / "MODULES"
    try:
        table = read_table(modules)
    except (OSError, ValueError) as error:
        print(f"check_module_layers: {error}", file=sys.stderr)
        return 1
    errors = table_errors(table, modules) + check(args.src, table)
    for error in errors:
        print(f"error: {error}", file=sys.stderr)
    if errors:
        print(f"check_module_layers: {len(errors)} include(s) against the layer order", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
