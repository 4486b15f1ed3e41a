#!/usr/bin/python3
"""Keeps a block of a Markdown file equal to what a command prints.

    scripts/generated-block.py check FILE NAME -- COMMAND [ARG...]
    scripts/generated-block.py write FILE NAME -- COMMAND [ARG...]

The block is the text between the lines ``<!-- generated: NAME -->`` and
``<!-- end generated: NAME -->``. ``check`` exits 1 with a diff when it differs from the
command's output (a ctest test runs it, so a table copied by hand cannot drift); ``write``
replaces it.
"""

import difflib
import pathlib
import subprocess
import sys


def main(argv):
    if len(argv) < 5 or argv[0] not in ("check", "write") or argv[3] != "--":
        sys.stderr.write(__doc__)
        return 2
    mode, path, name, command = argv[0], pathlib.Path(argv[1]), argv[2], argv[4:]
    begin, end = f"<!-- generated: {name} -->\n", f"<!-- end generated: {name} -->\n"
    text = path.read_text()
    if text.count(begin) != 1 or text.count(end) != 1 or text.index(begin) > text.index(end):
        print(f"{path}: expected one '{begin.strip()}' ... '{end.strip()}' block")
        return 1
    head, rest = text.split(begin)
    current, tail = rest.split(end)
    wanted = subprocess.run(command, check=True, capture_output=True, text=True).stdout
    if current == wanted:
        return 0
    if mode == "write":
        path.write_text(head + begin + wanted + end + tail)
        print(f"{path}: block {name} rewritten")
        return 0
    sys.stdout.writelines(difflib.unified_diff(current.splitlines(True), wanted.splitlines(True),
                                               f"{path} ({name})", " ".join(command)))
    print(f"{path}: block {name} is out of date: run scripts/generated-block.py write "
          f"{argv[1]} {name} -- {' '.join(command)}")
    return 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
