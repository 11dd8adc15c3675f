#!/usr/bin/env python3
"""test-summary.py - count test cases across meson test logs and print the
closing line "N passed, N failed".

Criterion tests run with --tap=- (protocol 'tap'), so each test case is one
TAP line; an executable that died before reporting all planned cases has the
missing ones counted as failed. Plain executables (protocol 'exitcode') count
as one case each. Usage: test-summary.py LABEL=BUILD_DIR [LABEL=BUILD_DIR ...]
"""
import glob
import json
import os
import re
import sys

OK = re.compile(r"^ok\b(?:\s+\d+)?\s*-?\s*(.*)$")
NOT_OK = re.compile(r"^not ok\b(?:\s+\d+)?\s*-?\s*(.*)$")
PLAN = re.compile(r"^1\.\.(\d+)")
DIAG_LINES = 6


def count(entry):
    """Return (passed, failed, skipped, failed_names) for one meson test entry.

    A failed case's name carries the first lines of its TAP diagnostics (the
    failed assertion's file, line and message), so that the summary, often all of a
    CI log anyone sees, says why it failed and not only what."""
    out = entry.get("stdout") or ""
    lines = out.splitlines()
    plan = None
    passed = failed = skipped = 0
    names = []
    tap = False
    diag = None         # the diagnostics of the last failed case, being collected
    for line in lines:
        if diag is not None and line.startswith(" "):
            # Criterion's YAML block: "---", "assertions: N", "failures:",
            # then "- FILE:LINE: |+" and the message, then "...".
            d = line.strip()
            if d.startswith("- ") and d.endswith("|+"):
                d = d[2:-2].rstrip()
            if d and d not in ("---", "...", "failures:") and not d.startswith("assertions:") \
                    and len(diag) < DIAG_LINES:
                diag.append(d)
            continue
        diag = None
        m = PLAN.match(line)
        if m:
            plan, tap = int(m.group(1)), True
            continue
        m = NOT_OK.match(line)
        if m:
            tap = True
            failed += 1
            diag = []
            names.append((m.group(1).split("  ")[0], diag))
            continue
        m = OK.match(line)
        if m:
            tap = True
            if "# SKIP" in line:
                skipped += 1
            else:
                passed += 1
    if not tap:
        if entry["result"] == "OK":
            return 1, 0, 0, []
        if entry["result"] == "SKIP":
            return 0, 0, 1, []
        return 0, 1, 0, [entry["name"] + " (" + entry["result"] + ")"]
    if plan is not None and passed + failed + skipped < plan:
        missing = plan - (passed + failed + skipped)
        failed += missing
        names.append("%s: %d case(s) never reported (%s)" % (entry["name"], missing, entry["result"]))
    elif entry["result"] not in ("OK", "SKIP", "EXPECTEDFAIL") and failed == 0:
        failed += 1
        names.append(entry["name"] + " (" + entry["result"] + ")")
    return passed, failed, skipped, names


def main():
    total_p = total_f = total_s = 0
    for arg in sys.argv[1:]:
        label, _, builddir = arg.partition("=")
        # `meson test --setup NAME` writes testlog-NAME.json: take the newest log.
        logs = glob.glob(builddir + "/meson-logs/testlog*.json")
        if not logs:
            print("%s: no test log in %s/meson-logs" % (label, builddir))
            total_f += 1
            continue
        log = open(max(logs, key=os.path.getmtime))
        p = f = s = 0
        for raw in log:
            entry = json.loads(raw)
            ep, ef, es, names = count(entry)
            p, f, s = p + ep, f + ef, s + es
            for n in names:
                n, diag = n if isinstance(n, tuple) else (n, [])
                print("  FAILED [%s] %s" % (label, n))
                for d in diag:
                    print("      %s" % d)
        print("%s: %d passed, %d failed, %d skipped" % (label, p, f, s))
        total_p, total_f, total_s = total_p + p, total_f + f, total_s + s
    # The closing line is exactly "N passed, N failed" (what CI and users
    # parse); the skipped cases are counted on the line before it.
    if total_s:
        print("%d skipped (each says why in its build's meson-logs; README.md, Testing)" % total_s)
    print("%d passed, %d failed" % (total_p, total_f))
    return 1 if total_f else 0


if __name__ == "__main__":
    sys.exit(main())
