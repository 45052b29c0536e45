#!/usr/bin/env python3
"""Turns the fio JSON of scripts/bench-peers.sh into a markdown report.

    report.py OUT_DIR       the whole report (meta.txt + raw/rep*/VARIANT/JOB.json)
    report.py --one JSON    one line for one job, for progress output
"""
import json
import os
import statistics
import sys

SEALDISK = ["sealdisk-auto", "sealdisk-pool", "sealdisk-inline", "sealdisk-nocrypt"]
# (peer, goal ratio or None): the acceptance goals of issue 2 for sealdisk's throughput.
PEERS = [("nbdkit-null", None), ("nbdkit-file", 1.0), ("nbdkit-luks", 2.0), ("qemu-nbd-luks", None)]
# The TLS variants (--tls=require, x509 over TCP) are compared only with each other.
TLS_PAIRS = [("sealdisk-tls", "nbdkit-file-tls", 1.0), ("sealdisk-tls", "nbdkit-luks-tls", 2.0)]


def load(path):
    with open(path) as f:
        text = f.read()
    # fio's nbd engine prints "fio: connected to NBD server" on stdout; --output keeps the
    # JSON clean, but be tolerant of anything before the first brace.
    return json.loads(text[text.index("{"):])


def metrics(path, job):
    """(throughput, mean latency µs, fio error) of one job; throughput in MiB/s for
    sequential jobs, IOPS for 4k jobs."""
    j = load(path)["jobs"][0]
    d = j["write"] if "write" in job else j["read"]
    tput = d["bw_bytes"] / 2**20 if job.startswith("seq") else d["iops"]
    return tput, d["lat_ns"]["mean"] / 1000.0, j.get("error", 0)


def one(path):
    job = os.path.basename(path)[: -len(".json")]
    tput, lat, err = metrics(path, job)
    unit = "MiB/s" if job.startswith("seq") else "IOPS"
    return f"{tput:,.0f} {unit}, mean lat {lat:,.0f} µs" + (f", fio error {err}" if err else "")


def read_meta(out):
    meta = {}
    with open(os.path.join(out, "meta.txt")) as f:
        for line in f:
            k, _, v = line.rstrip("\n").partition("=")
            meta[k] = v
    return meta


def fmt_tput(job, x):
    return f"{x:,.0f} MiB/s" if job.startswith("seq") else f"{x / 1000:,.1f}k IOPS"


def spread(xs):
    """Half the min-max range, relative to the median, as a percentage."""
    m = statistics.median(xs)
    return 0.0 if len(xs) < 2 or m == 0 else (max(xs) - min(xs)) / 2 / m * 100


def main(out):
    meta = read_meta(out)
    variants = meta["variants"].split()
    jobs = meta["jobs"].split()
    raw = os.path.join(out, "raw")
    reps = sorted(d for d in os.listdir(raw) if d.startswith("rep"))
    # data[job][variant] = lists of samples over repetitions
    data = {j: {v: {"tput": [], "lat": [], "cpu": []} for v in variants} for j in jobs}
    problems = []
    for rep in reps:
        for v in variants:
            for j in jobs:
                p = os.path.join(raw, rep, v, j + ".json")
                if not os.path.exists(p):
                    problems.append(f"missing {rep}/{v}/{j}")
                    continue
                tput, lat, err = metrics(p, j)
                if err:
                    problems.append(f"fio error {err} in {rep}/{v}/{j}")
                s = data[j][v]
                s["tput"].append(tput)
                s["lat"].append(lat)
                cpu = p[: -len(".json")] + ".cpu"
                fields = open(cpu).read().split() if os.path.exists(cpu) else []
                if len(fields) == 5:
                    t0, t1, s0, s1, hz = (float(x) for x in fields)
                    s["cpu"].append((t1 - t0) / hz / max(s1 - s0, 1e-9) * 100)

    med = lambda xs: statistics.median(xs) if xs else float("nan")
    w = print
    w(f"# sealdisk vs peers over NBD (fio, libnbd engine) — {meta.get('date', '?')}")
    w()
    w(f"- machine: {meta.get('nproc')} CPUs, {meta.get('cpu')} (flags: {meta.get('cpu_flags_aes', '').strip() or 'no aes'}), "
      f"{meta.get('mem')}, {meta.get('kernel')}, backing fs {meta.get('fs')}")
    w(f"- load average at start / end: {meta.get('loadavg_start')} / {meta.get('loadavg_end', '?')}")
    w(f"- sealdisk: git {meta.get('git')} ({meta.get('commit')}); {meta.get('sealdisk', 'not run')}")
    w(f"- {meta.get('fio')}, {meta.get('libnbd')}, {meta.get('nbdkit', 'nbdkit not run')}, {meta.get('qemu', 'qemu not run')}")
    w(f"- run: `{meta.get('command', '').strip()}` with {meta.get('env')}; {len(reps)} repetition(s), interleaved, medians shown")
    w()
    w("Throughput: MiB/s for 1M sequential jobs, IOPS for 4k random jobs; in brackets the mean "
      "total latency (submission to completion) in µs" + ("; ±: half the min–max range over repetitions" if len(reps) > 1 else "") + ".")
    w("nbdkit-null answers without storage or encryption: what nbdkit's request handling, fio's client and the socket cost alone. "
      "nbdkit-file serves the raw file with no encryption.")
    w(f"Page cache before every job: {meta.get('pagecache', 'sync only')}.")
    w()
    w("| job | " + " | ".join(variants) + " |")
    w("|---|" + "---:|" * len(variants))
    for j in jobs:
        cells = []
        for v in variants:
            s = data[j][v]
            if not s["tput"]:
                cells.append("–")
                continue
            c = f"{fmt_tput(j, med(s['tput']))} ({med(s['lat']):,.0f} µs)"
            if len(s["tput"]) > 1:
                c += f" ±{spread(s['tput']):.0f}%"
            cells.append(c)
        w(f"| {j} | " + " | ".join(cells) + " |")

    # Every sealdisk variant against the peers with a goal; the default (auto) against all.
    pairs = [
        (s, p, g)
        for s in SEALDISK
        if s in variants
        for p, g in PEERS
        if p in variants and (g is not None or s == "sealdisk-auto")
    ] + [(s, p, g) for s, p, g in TLS_PAIRS if s in variants and p in variants]
    if pairs:
        w()
        w("Throughput ratios (sealdisk ÷ peer, >1 means sealdisk is faster). Goals of issue 2: "
          "≥1.0× nbdkit-file, ≥2.0× nbdkit-luks (✓ met, ✗ missed).")
        w()
        w("| job | " + " | ".join(f"{s} ÷ {p}" for s, p, _ in pairs) + " |")
        w("|---|" + "---:|" * len(pairs))
        for j in jobs:
            cells = []
            for s, p, g in pairs:
                a, b = data[j][s]["tput"], data[j][p]["tput"]
                if not a or not b or med(b) == 0:
                    cells.append("–")
                    continue
                r = med(a) / med(b)
                mark = "" if g is None else (" ✓" if r >= g else " ✗")
                cells.append(f"{r:.2f}×{mark}")
            w(f"| {j} | " + " | ".join(cells) + " |")

    # The cipher variants (issue 11): each ÷ aes-xts served by the same build, normal or
    # with AES instructions masked (-noaes).
    cipher_pairs = []
    for v in variants:
        if not v.startswith("sealdisk-luks2-"):
            continue
        base = "sealdisk-luks2-aes-noaes" if v.endswith("-noaes") else "sealdisk-luks2-aes"
        if v != base and base in variants:
            cipher_pairs.append((v, base))
    if cipher_pairs:
        w()
        w("Cipher ratios (throughput ÷ aes-xts-plain64 in the same build; -noaes: both as on a CPU "
          "without AES instructions):")
        w()
        short = lambda v: v[len("sealdisk-luks2-"):]
        w("| job | " + " | ".join(f"{short(a)} ÷ {short(b)}" for a, b in cipher_pairs) + " |")
        w("|---|" + "---:|" * len(cipher_pairs))
        for j in jobs:
            cells = []
            for a, b in cipher_pairs:
                x, y = data[j][a]["tput"], data[j][b]["tput"]
                cells.append(f"{med(x) / med(y):.2f}×" if x and y and med(y) else "–")
            w(f"| {j} | " + " | ".join(cells) + " |")

    if any(data[j][v]["cpu"] for j in jobs for v in variants):
        w()
        w("Server CPU during each job (utime+stime of all its threads over the job's wall time, "
          "ramp included; 100% = one core). fio itself runs on the same cores.")
        w()
        w("| job | " + " | ".join(variants) + " |")
        w("|---|" + "---:|" * len(variants))
        for j in jobs:
            w(f"| {j} | " + " | ".join(
                f"{med(data[j][v]['cpu']):.0f}%" if data[j][v]["cpu"] else "–" for v in variants) + " |")

    extra = os.path.join(out, "problems.txt")
    if os.path.exists(extra):
        problems += [l.strip() for l in open(extra) if l.strip()]
    if problems:
        w()
        w("Problems during the run:")
        for p in problems:
            w(f"- {p}")
    w()
    w("Server command lines:")
    w()
    for v in variants:
        w(f"- {v}: `{meta.get('server.' + v, '?')}`")
    w()
    w("Jobs (the precondition runs once after each server start):")
    w()
    for j in jobs:
        w(f"- {j}: `{meta.get('job.' + j, '?')}`")
    w(f"- precondition: `{meta.get('precondition', '?')}`")
    w(f"- page cache: {meta.get('pagecache', 'sync only')}")


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "--one":
        print(one(sys.argv[2]))
    elif len(sys.argv) == 2:
        main(sys.argv[1])
    else:
        sys.exit(__doc__)
