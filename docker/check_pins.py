#!/usr/bin/env python3
"""Keep a base image's Python packages where they are while trtspec is installed on top (image build step).

Two subcommands, standard library only (they run before trtspec and its dependencies exist):

    check_pins.py constraints FREEZE OUT
        FREEZE is ``pip list --format=freeze`` of the base image; OUT is a pip constraints file pinning every
        package to its installed version, so ``pip install -c OUT trtspec`` may add packages but never move one.
        Lines pip cannot read as ``name==version`` (distro packages with non-PEP 440 versions) are left out
        and listed; ``compare`` still guards them.
    check_pins.py compare BEFORE AFTER [--require NAME ...]
        Prints the versions of the --require packages before and after and every package added, and exits 1
        when any package of BEFORE changed version or disappeared, or a --require package is missing.
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

# The version grammar of PEP 440 (its appendix gives this canonical pattern), for public and local versions.
_PEP440 = r"""
    v?(?:(?:[0-9]+!)?[0-9]+(?:\.[0-9]+)*
    (?:[-_.]?(?:a|b|c|rc|alpha|beta|pre|preview)[-_.]?[0-9]*)?
    (?:-[0-9]+|[-_.]?(?:post|rev|r)[-_.]?[0-9]*)?
    (?:[-_.]?dev[-_.]?[0-9]*)?)
    (?:\+[a-z0-9]+(?:[-_.][a-z0-9]+)*)?
"""
_PIN = re.compile(
    r"^(?P<name>[A-Za-z0-9](?:[A-Za-z0-9._-]*[A-Za-z0-9])?)==(?P<version>" + _PEP440 + r")$",
    re.VERBOSE | re.IGNORECASE,
)


def normalize(name: str) -> str:
    """PEP 503 name: ``Nvidia_ModelOpt`` and ``nvidia-modelopt`` are one package."""
    return re.sub(r"[-_.]+", "-", name).lower()


def parse_freeze(text: str) -> tuple[dict[str, tuple[str, str]], list[str]]:
    """``pip list --format=freeze`` text -> ({normalized name: (name, version)}, lines that are not pins)."""
    pins: dict[str, tuple[str, str]] = {}
    other: list[str] = []
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        name, sep, version = line.partition("==")
        if not sep:
            other.append(line)
            continue
        pins[normalize(name)] = (name.strip(), version.strip())
        if not _PIN.match(line):
            other.append(line)
    return pins, other


def constraints_text(freeze_text: str) -> tuple[str, list[str]]:
    """A pip constraints file from a freeze, and the lines left out of it (pip would reject them)."""
    kept = [line.strip() for line in freeze_text.splitlines() if _PIN.match(line.strip())]
    _, other = parse_freeze(freeze_text)
    header = "# The base image's packages, pinned: installing trtspec must not move any of them.\n"
    return header + "\n".join(kept) + "\n", other


def compare(before_text: str, after_text: str, require: list[str]) -> tuple[list[str], list[str]]:
    """(report lines, problems): changed or removed packages and missing required ones are problems."""
    before, _ = parse_freeze(before_text)
    after, _ = parse_freeze(after_text)
    report, problems = [], []
    for wanted in require:
        key = normalize(wanted)
        old, new = before.get(key, (wanted, None))[1], after.get(key, (wanted, None))[1]
        report.append(f"{wanted}: {old or 'absent'} -> {new or 'absent'}")
        if new is None:
            problems.append(f"{wanted} is not installed (required)")
    for key, (name, version) in sorted(before.items()):
        if key not in after:
            problems.append(f"{name} {version} was removed")
        elif after[key][1] != version:
            problems.append(f"{name} changed {version} -> {after[key][1]}")
    added = [f"{name}=={version}" for key, (name, version) in sorted(after.items()) if key not in before]
    report.append(f"added {len(added)} package(s): {', '.join(added) or 'none'}")
    return report, problems


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    sub = parser.add_subparsers(dest="command", required=True)
    cons = sub.add_parser("constraints", help="pip constraints pinning every package of a freeze")
    cons.add_argument("freeze", type=Path)
    cons.add_argument("out", type=Path)
    comp = sub.add_parser("compare", help="fail when a package of BEFORE changed in AFTER")
    comp.add_argument("before", type=Path)
    comp.add_argument("after", type=Path)
    comp.add_argument("--require", nargs="*", default=[], metavar="NAME")
    args = parser.parse_args(argv)
    if args.command == "constraints":
        text, left_out = constraints_text(args.freeze.read_text())
        args.out.write_text(text)
        for line in left_out:
            print(f"check_pins: not a pip pin, left unconstrained (still compared): {line}")
        return 0
    report, problems = compare(args.before.read_text(), args.after.read_text(), args.require)
    for line in report:
        print(f"check_pins: {line}")
    for line in problems:
        print(f"check_pins: ERROR {line}", file=sys.stderr)
    if problems:
        print(
            "check_pins: installing trtspec changed the base image's packages; see the errors above",
            file=sys.stderr,
        )
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
