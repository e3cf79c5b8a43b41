"""One table from benches/load/sweep.sh's points: python3 benches/load/sweep.py POINTS_DIR.

Each point is a directory SIZE-CONC holding run.sh's load-*.tsv; the figures are report.py's
medians. Standard library only.
"""

import glob
import os
import sys

from report import load_rows, summarise

PEERS = ("nginx-stream", "nginx-buffered", "haproxy")
ORDER = ("rangeway", "pingora", "nginx-stream", "nginx-buffered", "haproxy", "direct")


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
    print("(highest MB/s, lowest CPU/GB, among nginx both ways and HAProxy).")
    print()
    targets = [t for t in ORDER if any(("large", t) in s for _, _, s in points)]
    print("| object | conns | " + " | ".join(targets) + " | vs best peer |")
    print("|---|---|" + "---|" * len(targets) + "---|")
    for size, conc, summary in points:
        cells = []
        for target in targets:
            s = summary.get(("large", target))
            cells.append("—" if s is None else f"{s['mbps']:.0f} · {s['cpu_per_gb']:.2f} · {whole(s['p99_ms'])}")
        ours = summary.get(("large", "rangeway"))
        peers = [summary[("large", p)] for p in PEERS if ("large", p) in summary]
        if ours and peers:
            best_mbps = max(p["mbps"] for p in peers)
            best_cpu = min(p["cpu_per_gb"] for p in peers)
            versus = f"{ours['mbps'] / best_mbps:.2f}× MB/s, {ours['cpu_per_gb'] / best_cpu:.2f}× CPU"
        else:
            versus = "—"
        print(f"| {size} MiB | {conc} | " + " | ".join(cells) + f" | {versus} |")
    print()
    print("The machine's CPU s/GB (every core: the proxy, the origin, wrk, the rest), medians;")
    print("on loopback the kernel counts a byte's TCP work to whichever process pushes it, which")
    print("moves CPU between the proxy and the others but not out of this sum.")
    print()
    print("| object | conns | " + " | ".join(targets) + " | vs best peer |")
    print("|---|---|" + "---|" * len(targets) + "---|")
    for size, conc, summary in points:
        cells = []
        for target in targets:
            s = summary.get(("large", target))
            cells.append("—" if s is None else f"{s['machine_cpu_per_gb']:.2f}")
        ours = summary.get(("large", "rangeway"))
        peers = [summary[("large", p)] for p in PEERS if ("large", p) in summary]
        if ours and peers:
            best = min(p["machine_cpu_per_gb"] for p in peers)
            versus = f"{ours['machine_cpu_per_gb'] / best:.2f}×"
        else:
            versus = "—"
        print(f"| {size} MiB | {conc} | " + " | ".join(cells) + f" | {versus} |")


if __name__ == "__main__":
    main(sys.argv[1])
