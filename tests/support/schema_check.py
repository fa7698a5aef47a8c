#!/usr/bin/python3
"""Validates sampled strings against their schemas with python3-jsonschema (Draft 2020-12,
with format checks: date, email, uuid from jsonschema; time and date-time by RFC 3339 here).
Reads lines "FILE<TAB>HEX<TAB>1" from tests/support/grammar_sample; prints TAP per schema."""
import datetime
import json
import re
import sys

import jsonschema
from jsonschema import Draft202012Validator

checker = Draft202012Validator.FORMAT_CHECKER
TIME = re.compile(r"^(\d\d):(\d\d):(\d\d)(\.\d+)?(Z|[+-](\d\d):(\d\d))$")


@checker.checks("time")
def is_time(s):
    if not isinstance(s, str):
        return True
    m = TIME.match(s)
    if not m:
        return False
    h, mi, se = int(m[1]), int(m[2]), int(m[3])
    ok = h < 24 and mi < 60 and se < 60
    if m[6]:
        ok = ok and int(m[6]) < 24 and int(m[7]) < 60
    return ok


@checker.checks("date-time")
def is_date_time(s):
    if not isinstance(s, str):
        return True
    if "T" not in s:
        return False
    d, t = s.split("T", 1)
    try:
        datetime.date.fromisoformat(d)
    except ValueError:
        return False
    return len(d) == 10 and is_time(t)


def main():
    schemas, results, order = {}, {}, []
    for line in sys.stdin:
        parts = line.rstrip("\n").split("\t")
        f = parts[0]
        if f not in results:
            results[f] = [0, []]
            order.append(f)
        if parts[1].startswith("error:"):
            results[f][1].append(parts[1])
            continue
        if f not in schemas:
            with open(f, encoding="utf-8") as fh:
                s = json.load(fh)
            schemas[f] = Draft202012Validator(s, format_checker=checker)
        raw = bytes.fromhex(parts[1])
        results[f][0] += 1
        try:
            inst = json.loads(raw.decode("utf-8"))
        except (ValueError, UnicodeDecodeError) as e:
            results[f][1].append("not JSON (%s): %r" % (e, raw[:120]))
            continue
        errs = list(schemas[f].iter_errors(inst))
        if errs:
            results[f][1].append("invalid (%s): %r" % (errs[0].message[:160], raw[:160]))
    print("1..%d" % len(order))
    bad = 0
    for n, f in enumerate(order, 1):
        total, errs = results[f]
        ok = not errs and total > 0
        bad += not ok
        print("%s %d - %s: %d samples parse and validate" % ("ok" if ok else "not ok", n, f, total))
        for e in errs[:3]:
            print("#   " + e)
    return 1 if bad else 0


if __name__ == "__main__":
    main()
