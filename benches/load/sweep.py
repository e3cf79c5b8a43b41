"""One summary from benches/load/sweep.sh's points: python3 benches/load/sweep.py POINTS_DIR.

Each point is a directory SIZE-CONC holding run.sh's load-*.tsv and load-*.md; the tables' figures
are report.py's medians, and each point's report follows them, its headings one level down, so
that the sweep is one file. Standard library only.
"""

import glob
import os
import sys

from report import load_rows, summarise

PEERS = ("nginx-stream", "nginx-buffered", "haproxy")
ORDER = ("rangeway", "rangeway-before", "pingora", "nginx-stream", "nginx-buffered", "haproxy", "direct")


def whole(value):
    return "—" if value != value else f"{value:.0f}"  # NaN: no download completed


def main(points_dir):
    points = []
    for path in glob.glob(os.path.join(points_dir, "*-*", "load-*.tsv")):
        size, conc = os.path.basename(os.path.dirname(path)).split("-")
        points.append((int(size), int(conc), summarise(load_rows(path))))
    points.sort(key=lambda p: (p[0], p[1]))
    print("# The large workload swept over object size and concurrency")
    print()
    print("Each cell: MB/s · CPU s/GB of the proxy · p99 of a download in ms (medians).")
    print("*vs best peer*: rangeway's MB/s and CPU/GB as ratios of the best peer's at that point")
    print("(highest MB/s, lowest CPU/GB, among nginx both ways and HAProxy). *vs before*, when the")
    print("sweep ran with BEFORE_BIN: rangeway's MB/s and CPU/GB as ratios of the build before's.")
    print()
    targets = [t for t in ORDER if any(("large", t) in s for _, _, s in points)]

    def proxy_cells(s):
        return f"{s['mbps']:.0f} · {s['cpu_per_gb']:.2f} · {whole(s['p99_ms'])}"

    def proxy_versus(ours, peers):
        best_mbps = max(p["mbps"] for p in peers)
        best_cpu = min(p["cpu_per_gb"] for p in peers)
        return f"{ours['mbps'] / best_mbps:.2f}× MB/s, {ours['cpu_per_gb'] / best_cpu:.2f}× CPU"

    table(points, targets, proxy_cells, proxy_versus)
    print()
    print("The machine's CPU s/GB (every core: the proxy, the origin, wrk, the rest), medians;")
    print("on loopback the kernel counts a byte's TCP work to whichever process pushes it, which")
    print("moves CPU between the proxy and the others but not out of this sum.")
    print()

    def machine_versus(ours, peers):
        return f"{ours['machine_cpu_per_gb'] / min(p['machine_cpu_per_gb'] for p in peers):.2f}×"

    table(points, targets, lambda s: f"{s['machine_cpu_per_gb']:.2f}", machine_versus)
    reports(points_dir)


def reports(points_dir):
    """Each point's report (run.sh's load-*.md), under a heading of its own."""
    found = []
    for path in glob.glob(os.path.join(points_dir, "*-*", "load-*.md")):
        size, conc = os.path.basename(os.path.dirname(path)).split("-")
        found.append((int(size), int(conc), path))
    if not found:
        return
    print()
    print("## Each point's report")
    print()
    print("The load harness's report of every point, as benches/load/run.sh wrote it (headings one")
    print("level down).")
    for size, conc, path in sorted(found):
        with open(path) as f:
            lines = f.read().rstrip("\n").split("\n")
        stamp = os.path.basename(path)[:-3]
        print()
        print(f"### {size} MiB × {conc} connections: {lines[0].lstrip('# ')} ({stamp})")
        for line in lines[1:]:
            print("##" + line if line.startswith("## ") else line)


def table(points, targets, cell, versus):
    """One row a point: cell(summary) for each target, then versus(rangeway's, the peers'), and
    versus(rangeway's, the build before's) when it ran."""
    before = "rangeway-before" in targets
    print("| object | conns | " + " | ".join(targets) + " | vs best peer |" + (" vs before |" if before else ""))
    print("|---|---|" + "---|" * len(targets) + "---|" + ("---|" if before else ""))
    for size, conc, summary in points:
        cells = ["—" if summary.get(("large", t)) is None else cell(summary[("large", t)]) for t in targets]
        ours = summary.get(("large", "rangeway"))
        peers = [summary[("large", p)] for p in PEERS if ("large", p) in summary]
        compared = versus(ours, peers) if ours and peers else "—"
        row = f"| {size} MiB | {conc} | " + " | ".join(cells) + f" | {compared} |"
        if before:
            was = summary.get(("large", "rangeway-before"))
            row += f" {versus(ours, [was]) if ours and was else '—'} |"
        print(row)

if __name__ == "__main__":
    main(sys.argv[1])
