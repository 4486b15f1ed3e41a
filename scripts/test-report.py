#!/usr/bin/python3
"""Summarises the JUnit reports of scripts/test.sh: every test case counted once, the slowest 20.

    scripts/test-report.py REPORTS_DIR [REPORT.xml ...]

ctest runs each GoogleTest binary (or shard of one) as one test; its cases are read from the
binary's own report, REPORTS_DIR/gtest/<ctest name>.xml. A ctest test without such a report
(a script, a fuzz corpus replay, a Go test) counts as one case, and so does a binary that failed
without writing its report (a crash): it is a failure. Exits 1 when a report named on the command
line is missing.
"""

import pathlib
import sys
import xml.etree.ElementTree as ET


def outcome(case):
    """'failed', 'skipped' or 'passed' for a JUnit <testcase> of ctest, GoogleTest or pytest."""
    if case.find("failure") is not None or case.find("error") is not None:
        return "failed"
    if case.get("status") == "fail":
        return "failed"
    if case.find("skipped") is not None or case.get("status") in ("notrun", "disabled"):
        return "skipped"
    if case.get("result") in ("skipped", "suppressed"):
        return "skipped"
    return "passed"


def cases_of(path, source):
    """(source, name, outcome, seconds) for each test case of a JUnit report."""
    for case in ET.parse(path).getroot().iter("testcase"):
        name = case.get("name", "?")
        classname = case.get("classname", "")
        full = f"{classname}.{name}" if classname and source != "ctest" else name
        yield source, full, outcome(case), float(case.get("time") or 0)


def main():
    reports = pathlib.Path(sys.argv[1])
    gtest_dir = reports / "gtest"
    rows, missing = [], []
    for name in sys.argv[2:]:
        path = reports / name
        if not path.exists():
            missing.append(name)
            continue
        source = path.stem
        if source != "ctest":
            rows.extend(cases_of(path, source))
            continue
        for _, test, result, seconds in cases_of(path, "ctest"):
            gtest_report = gtest_dir / f"{test}.xml"
            if not gtest_report.exists():
                rows.append(("ctest", test, result, seconds))
                continue
            cases = list(cases_of(gtest_report, test))
            rows.extend(cases)
            if result == "failed" and not any(r == "failed" for _, _, r, _ in cases):
                # The process failed outside any case (a crash after them, a timeout).
                rows.append((test, "(the process)", "failed", seconds))
    counts = {"passed": 0, "failed": 0, "skipped": 0}
    for _, _, result, _ in rows:
        counts[result] += 1
    print("slowest 20 tests:")
    for source, name, _, seconds in sorted(rows, key=lambda row: -row[3])[:20]:
        print(f"  {seconds:8.2f} s  {source}: {name}")
    failed = [(source, name) for source, name, result, _ in rows if result == "failed"]
    for source, name in failed[:50]:
        print(f"FAILED {source}: {name}")
    for name in missing:
        print(f"{name}: missing report")
    print(f"summary: {counts['passed']} passed, {counts['failed'] + len(missing)} failed, "
          f"{counts['skipped']} skipped")
    return 1 if missing else 0


if __name__ == "__main__":
    sys.exit(main())
