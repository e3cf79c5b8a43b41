"""One summary from benches/load/sweep.sh's runs: python3 benches/load/sweep.py POINTS_DIR.

Each run is a directory SIZE-CONC-LOWAT (SIZE-CONC from sweeps before the TCP setting was swept)
holding run.sh's load-*.tsv, load-*.meta and load-*.md; the tables' figures are report.py's
medians (runs with steal above the run's STEAL_MAX left out), and each run's report follows them,
its headings one level down, so that the sweep is one file. Standard library only.
"""

import glob
import os
import sys

from report import discards, foreign_load, load_rows, summarise

PEERS = ("nginx-stream", "nginx-buffered", "haproxy")
ORDER = ("rangeway", "rangeway-before", "splice-floor", "copy-floor", "pingora", "nginx-stream",
         "nginx-buffered", "haproxy", "direct")


def whole(value):
    return "—" if value != value else f"{value:.0f}"  # NaN: no download completed


def num(value, digits=2):
    return "—" if value != value else f"{value:.{digits}f}"


def read_meta(tsv):
    path = tsv[: -len(".tsv")] + ".meta"
    try:
        with open(path) as f:
            return dict(line.rstrip("\n").split("\t", 1) for line in f if "\t" in line)
    except OSError:
        return {}


def lowat_order(lowat):
    return (0, 0) if lowat == "default" else (1, int(lowat))


def load_points(points_dir):
    """[(size, conc, lowat, summary, tsv path)] sorted by size, connections, setting."""
    points = []
    for path in glob.glob(os.path.join(points_dir, "*-*", "load-*.tsv")):
        parts = os.path.basename(os.path.dirname(path)).split("-")
        size, conc = int(parts[0]), int(parts[1])
        lowat = parts[2] if len(parts) > 2 else "default"
        steal_max = float(read_meta(path).get("steal_max", 2))
        points.append((size, conc, lowat, summarise(load_rows(path), steal_max), path))
    points.sort(key=lambda p: (p[0], p[1], lowat_order(p[2])))
    return points


def divide(a, b):
    """a ÷ b, NaN when either is missing or b is not positive (no ratio to give)."""
    if a != a or b != b or b <= 0:
        return float("nan")
    return a / b


def times(value):
    return "—" if value != value else f"{value:.2f}×"


def checked(value, limit, at_most):
    """A ratio, marked ✗ when it misses the issue's target (≤ limit if at_most, else ≥ limit)."""
    if value != value:
        return "—"
    miss = value > limit if at_most else value < limit
    return f"{value:.2f}×" + (" ✗" if miss else "")


def ratio_table(points):
    """Issue 46's "Must show" ratios, one row per point and TCP setting."""
    print("## Issue 46's ratios")
    print()
    print("rangeway against nginx buffered (*nginx*), the splice floor (*splice*) and the direct run,")
    print("per point and TCP setting (*lowat*: `default` is the system's settings, a number is")
    print("net.ipv4.tcp_notsent_lowat on every socket). Medians of each run's timed repetitions; ✗: the")
    print("issue's target missed. *own CPU*: the proxy process's CPU s/GB. *machine above direct*: every")
    print("core's busy s/GB (/proc/stat, irq and softirq included) less the direct run's. *syscalls*:")
    print("rangeway's system calls per MiB, from the counting run. *left out*: runs with steal above the")
    print("limit, of all timed runs at that point and setting. With BEFORE_BIN the p99 cell also gives")
    print("the build before's, run beside it (the issue: p99 no worse than before).")
    print()
    print("| object | conns | lowat | own CPU ÷ nginx (≤ 0.6) | own CPU ÷ splice (≤ 1.3) "
          "| machine above direct ÷ nginx (≤ 0.75) | MB/s ÷ nginx (≥ 1) | p99 ms: rangeway, nginx "
          "| MB/s: rangeway, direct | syscalls/MiB (≤ 4) | left out |")
    print("|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    for size, conc, lowat, summary, _ in points:
        get = lambda t: summary.get(("large", t))  # noqa: E731
        ours, nginx, floor, direct = get("rangeway"), get("nginx-buffered"), get("splice-floor"), get("direct")
        before = get("rangeway-before")
        nan = float("nan")
        pick = lambda s, k: s[k] if s else nan  # noqa: E731
        left_out, runs = discards(summary)
        cells = [
            checked(divide(pick(ours, "cpu_per_gb"), pick(nginx, "cpu_per_gb")), 0.6, True),
            checked(divide(pick(ours, "cpu_per_gb"), pick(floor, "cpu_per_gb")), 1.3, True),
            checked(divide(pick(ours, "machine_above_direct"), pick(nginx, "machine_above_direct")), 0.75, True),
            checked(divide(pick(ours, "mbps"), pick(nginx, "mbps")), 1.0, False),
            f"{whole(pick(ours, 'p99_ms'))}, {whole(pick(nginx, 'p99_ms'))}"
            + (f" (before: {whole(before['p99_ms'])})" if before else ""),
            f"{whole(pick(ours, 'mbps'))}, {whole(pick(direct, 'mbps'))}",
            "—" if pick(ours, "syscalls_per_mib") != pick(ours, "syscalls_per_mib")
            else f"{pick(ours, 'syscalls_per_mib'):.1f}" + (" ✗" if pick(ours, "syscalls_per_mib") > 4 else ""),
            f"{left_out} of {runs}",
        ]
        print(f"| {size} MiB | {conc} | {lowat} | " + " | ".join(cells) + " |")


def main(points_dir):
    points = load_points(points_dir)
    print("# The large workload swept over object size, concurrency and TCP setting")
    print()
    foreign = max((foreign_load(p[3]) for p in points), default=0)
    if foreign > 10:
        print(f"**Taken under foreign load**: other processes used up to {foreign:.0f} % of a core during")
        print("some runs (each run's *others* column, below); treat the figures as a check that the harness")
        print("works, not as results.")
        print()
    left_out, runs = (sum(x) for x in zip(*(discards(p[3]) for p in points))) if points else (0, 0)
    print(f"Runs left out for steal above the limit: {left_out} of {runs}.")
    print()
    ratio_table(points)
    print()
    targets = [t for t in ORDER if any(("large", t) in p[3] for p in points)]

    print("## Each target")
    print()
    print("Each cell: MB/s · CPU s/GB of the proxy · p99 of a download in ms (medians).")
    print("*vs best peer*: rangeway's MB/s and CPU/GB as ratios of the best peer's at that point")
    print("(highest MB/s, lowest CPU/GB, among nginx both ways and HAProxy, those that ran). *vs before*,")
    print("when the sweep ran with BEFORE_BIN: rangeway's MB/s and CPU/GB as ratios of the build before's.")
    print()

    def proxy_cells(s):
        return f"{whole(s['mbps'])} · {num(s['cpu_per_gb'])} · {whole(s['p99_ms'])}"

    def proxy_versus(ours, peers):
        best_mbps = max(p["mbps"] for p in peers)
        best_cpu = min(p["cpu_per_gb"] for p in peers)
        return f"{times(divide(ours['mbps'], best_mbps))} MB/s, {times(divide(ours['cpu_per_gb'], best_cpu))} CPU"

    table(points, targets, proxy_cells, proxy_versus,
          direct_cell=lambda s: f"{whole(s['mbps'])} · — · {whole(s['p99_ms'])}")
    print()
    print("The machine's CPU s/GB above the direct run: every core's busy time (/proc/stat: user, nice,")
    print("system, irq, softirq) per GB delivered, less the same figure of the direct run at that point")
    print("and setting (the *direct* column gives that base). On loopback the kernel counts a byte's TCP")
    print("work to whichever process pushes it, which moves CPU between the proxy and the others but not")
    print("out of this sum.")
    print()

    def machine_cells(s):
        return num(s["machine_above_direct"])

    def machine_versus(ours, peers):
        return times(divide(ours["machine_above_direct"], min(p["machine_above_direct"] for p in peers)))

    table(points, targets, machine_cells, machine_versus,
          direct_cell=lambda s: f"(base {num(s['machine_cpu_per_gb'])})")
    print()
    print("System calls · context switches of the proxy per MiB delivered (every thread; calls from the")
    print("counting run, switches the median of the timed runs).")
    print()
    table(points, targets, lambda s: f"{num(s['syscalls_per_mib'], 1)} · {num(s['switches_per_mib'], 1)}", None,
          direct_cell=lambda s: "—")
    reports(points)


def reports(points):
    """Each run's report (run.sh's load-*.md), under a heading of its own."""
    found = []
    for size, conc, lowat, _, tsv in points:
        for path in glob.glob(os.path.join(os.path.dirname(tsv), "load-*.md")):
            found.append((size, conc, lowat, path))
    if not found:
        return
    print()
    print("## Each run's report")
    print()
    print("The load harness's report of every point and setting, as benches/load/run.sh wrote it")
    print("(headings one level down).")
    for size, conc, lowat, path in found:
        with open(path) as f:
            lines = f.read().rstrip("\n").split("\n")
        stamp = os.path.basename(path)[:-3]
        print()
        print(f"### {size} MiB × {conc} connections, notsent_lowat {lowat}: {lines[0].lstrip('# ')} ({stamp})")
        for line in lines[1:]:
            print("##" + line if line.startswith("## ") else line)


def table(points, targets, cell, versus, direct_cell=None):
    """One row a point and setting: cell(summary) for each target (direct_cell for direct, if
    given), then versus(rangeway's, the peers'), and versus(rangeway's, the build before's) when it
    ran; no comparison columns if versus is None."""
    before = versus is not None and "rangeway-before" in targets
    head = "| object | conns | lowat | " + " | ".join(targets) + " |"
    rule = "|---|---|---|" + "---|" * len(targets)
    if versus is not None:
        head += " vs best peer |" + (" vs before |" if before else "")
        rule += "---|" + ("---|" if before else "")
    print(head)
    print(rule)
    for size, conc, lowat, summary, _ in points:
        cells = []
        for t in targets:
            s = summary.get(("large", t))
            if s is None:
                cells.append("—")
            elif t == "direct" and direct_cell is not None:
                cells.append(direct_cell(s))
            else:
                cells.append(cell(s))
        row = f"| {size} MiB | {conc} | {lowat} | " + " | ".join(cells) + " |"
        if versus is not None:
            ours = summary.get(("large", "rangeway"))
            peers = [summary[("large", p)] for p in PEERS if ("large", p) in summary]
            row += f" {versus(ours, peers) if ours and peers else '—'} |"
            if before:
                was = summary.get(("large", "rangeway-before"))
                row += f" {versus(ours, [was]) if ours and was else '—'} |"
        print(row)


if __name__ == "__main__":
    main(sys.argv[1])
