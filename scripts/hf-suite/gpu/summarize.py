"""summarize.py OUT RUNS_FILE: writes a short summary of the four pytest logs in OUT to stdout.
Per run: the exit status, the time limit, pytest's last line, counts from the -v lines. Per suite: every test whose
outcome differs between zspeed and real DeepSpeed, with the one-line reasons from pytest's short summary."""
import os
import re
import sys
from collections import Counter

out, runs_file = sys.argv[1], sys.argv[2]
V = re.compile(r"^(tests/\S+::\S+) (PASSED|FAILED|SKIPPED|ERROR|XFAIL|XPASS)\b")
S = re.compile(r"^(FAILED|ERROR) (tests/\S+::\S+)(?: - (.*))?$")
SK = re.compile(r"^SKIPPED \[\d+\] (\S+?):(\d+): (.*)$")


H = re.compile(r"^_+ (\S*[A-Za-z]\S*) _+$")


def parse(path):
    res, why, last, sect, err = {}, {}, "", None, {}
    if not os.path.exists(path):
        return None, None, "(no log)"
    for line in open(path, errors="replace"):
        line = line.rstrip("\n")
        m = H.match(line)
        if m:
            sect = m.group(1)
        elif sect and line.startswith("E   ") and line[4:].strip():
            err.setdefault(sect, []).append(line[4:].strip())
        m = V.match(line)
        if m:
            res.setdefault(m.group(1), m.group(2))
        m = S.match(line)
        if m:
            why[m.group(2)] = (m.group(3) or "")[:220]
        if line.startswith("=") and (" passed" in line or " failed" in line or " skipped" in line or " error" in line):
            last = line.strip("= ")
    for i in res:
        key = ".".join(i.split("::")[-2:])
        if not why.get(i) and key in err:
            lines = err[key]
            exc = [e for e in lines if re.match(r"^[\w.]*(Error|Exception|Exit|Interrupt)\b", e)]
            exc = [e for e in exc if "ChildFailedError" not in e] or exc
            if len(exc) > 1 and exc[0] != exc[-1]:
                why[i] = exc[0][:70] + " ... " + exc[-1][:150]
            else:
                why[i] = (exc[-1:] or lines[-1:])[0][:220]
    return res, why, last


runs = {}
if os.path.exists(runs_file):
    for line in open(runs_file):
        parts = line.split()
        if parts:
            runs[parts[0]] = " ".join(parts[1:])

print("== runs (rc 124/137: killed by timeout; last line empty: pytest did not finish)")
parsed = {}
for name in ["zspeed-transformers", "zspeed-accelerate", "realds-transformers", "realds-accelerate"]:
    res, why, last = parse(os.path.join(out, name + ".log"))
    parsed[name] = (res, why)
    counts = Counter(res.values()) if res else Counter()
    print(f"{name}: {runs.get(name, '(not run)')}")
    print(f"    pytest: {last or '(no final line)'}")
    print(f"    -v lines: {dict(sorted(counts.items()))}")

for suite in ["transformers", "accelerate"]:
    z, d = parsed[f"zspeed-{suite}"], parsed[f"realds-{suite}"]
    if not z[0] and not d[0]:
        continue
    zr, dr = z[0] or {}, d[0] or {}
    ids = sorted(set(zr) | set(dr))
    one = [i for i in ids if (i in zr) != (i in dr)]
    if one:
        print(f"\n== {suite}: {len(one)} tests have an outcome on one side only (not collected / not reached there)")
        for i in one[:40]:
            print(f"  {i.split('::', 1)[1]}: {zr.get(i, '-')} | {dr.get(i, '-')}")
    diff = [i for i in ids if i in zr and i in dr and zr[i] != dr[i]]
    print(f"\n== {suite}: {len(diff)} of {len(ids)} tests differ (zspeed | real DeepSpeed 0.19.8)")
    for i in diff:
        print(f"  {i.split('::', 1)[1]}: {zr.get(i, '-')} | {dr.get(i, '-')}")
        for side, (r, why) in (("zspeed", z), ("realds", d)):
            if why and i in why and why[i]:
                print(f"      {side}: {why[i]}")
    both = [i for i in ids if zr.get(i) in ("FAILED", "ERROR") and dr.get(i) in ("FAILED", "ERROR")]
    print(f"\n== {suite}: failing on both sides ({len(both)})")
    for i in both:
        print(f"  {i.split('::', 1)[1]}")
        print(f"      zspeed: {(z[1] or {}).get(i, '')[:160]}")
        print(f"      realds: {(d[1] or {}).get(i, '')[:160]}")
