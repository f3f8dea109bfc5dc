#!/usr/bin/env python3
"""List the functions of src/ longer than a limit (default 100 lines), longest first.

A function's length is its lines from the `fn` line to its closing brace, both included, as
rustfmt lays it out (the closing brace at the indentation of the `fn` line). Functions inside
`#[cfg(test)]` modules are left out unless --tests is given. A function whose reason for its
length is written beside it (a plain `//` comment just above it, among its doc and attribute
lines, that begins "Longer than N lines on purpose:") is listed as explained and does not count.

  scripts/long-functions.py [--limit N] [--tests] [--check] [PATH ...]   # default PATH: src

--check exits 1 when an unexplained function is over the limit.
"""
import argparse
import os
import re
import sys

FN = re.compile(
    r'^(?P<indent>\s*)(pub(\([^)]*\))?\s+)?(default\s+)?(const\s+)?(async\s+)?(unsafe\s+)?'
    r'(extern\s+"[^"]*"\s+)?fn\s+(?P<name>\w+)'
)
TEST_MOD = re.compile(r'^(?P<indent>\s*)#\[cfg\(test\)\]\s*$')
REASON = re.compile(r'^//\s*Longer than \d+ lines on purpose:')
MOD = re.compile(r'^(?P<indent>\s*)(pub(\([^)]*\))?\s+)?mod\s+\w+\s*\{\s*$')


def rust_files(paths):
    for path in paths:
        if os.path.isfile(path):
            yield path
            continue
        for root, _, names in os.walk(path):
            for name in sorted(names):
                if name.endswith('.rs'):
                    yield os.path.join(root, name)


def test_ranges(lines):
    """Line ranges (start, end) of the `#[cfg(test)] mod … { … }` blocks."""
    ranges = []
    for i, line in enumerate(lines):
        m = TEST_MOD.match(line)
        if not m or i + 1 >= len(lines) or not MOD.match(lines[i + 1]):
            continue
        close = m.group('indent') + '}'
        for j in range(i + 2, len(lines)):
            if lines[j].rstrip() == close:
                ranges.append((i, j))
                break
    return ranges


def explained(lines, i):
    """Whether a comment just above line i (among doc, attribute and comment lines) says why the
    function is long."""
    j = i - 1
    while j >= 0:
        text = lines[j].strip()
        if not (text.startswith('//') or text.startswith('#[')):
            return False
        if REASON.match(text):
            return True
        j -= 1
    return False


def functions(path, tests):
    with open(path, encoding='utf-8') as f:
        lines = f.read().split('\n')
    skip = [] if tests else test_ranges(lines)
    for i, line in enumerate(lines):
        m = FN.match(line)
        if not m or any(a <= i <= b for a, b in skip):
            continue
        indent = m.group('indent')
        # The signature ends at the first line ending in `{` (a body) or `;` (no body).
        j = i
        while j < len(lines) and not lines[j].rstrip().endswith(('{', ';')):
            j += 1
        if j == len(lines) or lines[j].rstrip().endswith(';'):
            continue
        if lines[j].rstrip().endswith('}'):
            continue
        close = indent + '}'
        for k in range(j + 1, len(lines)):
            if lines[k].rstrip() == close:
                yield m.group('name'), i + 1, k - i + 1, explained(lines, i)
                break


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument('paths', nargs='*', default=['src'])
    parser.add_argument('--limit', type=int, default=100)
    parser.add_argument('--tests', action='store_true', help='count functions in test modules too')
    parser.add_argument('--check', action='store_true', help='exit 1 on an unexplained long function')
    args = parser.parse_args()
    found = []
    for path in rust_files(args.paths):
        for name, line, length, why in functions(path, args.tests):
            if length > args.limit:
                found.append((length, f'{path}:{line}', name, why))
    found.sort(key=lambda f: (-f[0], f[1]))
    for length, place, name, why in found:
        print(f'{length:5}  {place}  {name}{"  (reason beside it)" if why else ""}')
    unexplained = sum(1 for f in found if not f[3])
    print(f'{len(found)} functions over {args.limit} lines, {unexplained} without a reason beside them')
    return 1 if args.check and unexplained else 0


if __name__ == '__main__':
    sys.exit(main())
