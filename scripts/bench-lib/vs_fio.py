#!/usr/bin/env python3
"""Report of scripts/bench-vs-fio.sh: fio's and the harness's IOPS for the same job.

    vs_fio.py OUT_DIR JOB...          the markdown table (medians, ratio, per-repetition ratios)
    vs_fio.py --one OUT_DIR JOB REP   one line for one repetition, for progress output
"""
import os
import statistics
import sys

from report import load, read_meta  # same directory: fio JSON and meta.txt readers

AGREEMENT = 0.15  # issue 5: the harness agrees with fio within 15%


def iops(path, job):
    """Total IOPS of the direction the job measures, summed over its job entries (fio with
    group_reporting has one; the harness has one per clone)."""
    key = "write" if "write" in job else "read"
    return sum(j[key]["iops"] for j in load(path)["jobs"])


def pair(out, job, rep):
    f = os.path.join(out, f"{job}.fio.{rep}.json")
    h = os.path.join(out, f"{job}.harness.{rep}.json")
    if not (os.path.exists(f) and os.path.exists(h)):
        return None
    return iops(f, job), iops(h, job)


def one(out, job, rep):
    p = pair(out, job, rep)
    if p is None:
        return "missing output"
    f, h = p
    return f"fio {f:,.0f} IOPS, harness {h:,.0f} IOPS, ratio {h / f:.2f}"


def main(out, jobs):
    meta = read_meta(out)
    w = print
    w(f"# sealdisk bench vs fio, same server, same transport — {meta.get('date', '?')}")
    w()
    w(f"- run: `{meta.get('command', '').strip()}` with {meta.get('env')}, commit {meta.get('commit')}")
    w(f"- load average at start / end: {meta.get('loadavg_start')} / {meta.get('loadavg_end', '?')}")
    w(f"- fio: `{meta.get('fio_cmd')}` ({meta.get('fio')})")
    w(f"- harness: `{meta.get('harness_cmd')}`")
    w()
    w("| job | fio IOPS (median) | harness IOPS (median) | harness ÷ fio | per repetition | within 15% |")
    w("|---|---:|---:|---:|---|:---:|")
    for job in jobs:
        reps = sorted(
            int(n.split(".")[-2]) for n in os.listdir(out) if n.startswith(job + ".fio.") and n.endswith(".json")
        )
        pairs = [p for p in (pair(out, job, r) for r in reps) if p]
        if not pairs:
            w(f"| {job} | – | – | – | – | – |")
            continue
        f = statistics.median(p[0] for p in pairs)
        h = statistics.median(p[1] for p in pairs)
        ratio = h / f
        per = ", ".join(f"{p[1] / p[0]:.2f}" for p in pairs)
        ok = "✓" if abs(ratio - 1) <= AGREEMENT else "✗"
        w(f"| {job} | {f:,.0f} | {h:,.0f} | {ratio:.2f} | {per} | {ok} |")


if __name__ == "__main__":
    if len(sys.argv) == 5 and sys.argv[1] == "--one":
        print(one(sys.argv[2], sys.argv[3], sys.argv[4]))
    elif len(sys.argv) >= 3:
        main(sys.argv[1], sys.argv[2:])
    else:
        sys.exit(__doc__)
