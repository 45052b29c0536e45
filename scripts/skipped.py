#!/usr/bin/env python3
"""Lists the SKIPPED lines of a nextest run (scripts/test.sh; docs/TESTING.md).

A test that cannot do its work because a tool or a permission is missing passes and says
so on stderr (`SKIPPED: cryptsetup is not installed ...`, `SKIPPED PART: ...`). nextest
does not print a passing test's output, so scripts/test.sh keeps every test's output in
the run's JUnit report (.config/nextest.toml) and this prints those lines, per test.

    scripts/skipped.py target/nextest/default/junit.xml
"""

import sys
import xml.etree.ElementTree as ET


def main() -> int:
    try:
        root = ET.parse(sys.argv[1]).getroot()
    except (OSError, ET.ParseError) as e:
        print(f"skipped: no JUnit report to read ({e})", file=sys.stderr)
        return 1
    found = []
    for suite in root.iter("testsuite"):
        for case in suite.iter("testcase"):
            out = "\n".join((e.text or "") for tag in ("system-out", "system-err") for e in case.iter(tag))
            lines = sorted({l.strip() for l in out.splitlines() if "SKIPPED" in l})
            if lines:
                found.append((f"{suite.get('name')} {case.get('name')}", lines))
    if found:
        print(f"test.sh: {len(found)} tests skipped all or part of their work:")
        for name, lines in found:
            for line in lines:
                print(f"  {name}: {line}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
