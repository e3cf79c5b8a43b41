"""Turns benches/load/run.sh's raw rows into the markdown report and an SVG chart.

    python3 benches/load/report.py RAW.tsv META MD SVG

Standard library only, so it runs wherever run.sh does. RAW.tsv has one row per measured wrk run
(see run.sh's header line), and one per counting run (rep "count": only its system calls are
used); META is `key<TAB>value` lines about the machine and the command. Every figure is the median
over the timed repetitions whose steal was at most STEAL_MAX % (the others are left out and
counted), except peak RSS (the largest) and errors (the sum).
"""

import csv
import html
import re
import statistics
import sys

WORKLOADS = {
    "large": "large: whole objects",
    "small": "small: tiny objects, many requests",
    "resume": "resume: random ranges of one big object",
    "chain": "chain: the large workload through rangeway's middleware",
    "beside": "beside: tiny objects while large downloads run (MB/s, CPU s/GB: of all bytes moved)",
}
TARGET_NAMES = {
    "direct": "direct to origin",
    "rangeway": "rangeway",
    "rangeway-aes": "rangeway checksum+aes128gcm",
    "rangeway-gzip1": "rangeway gzip level 1",
    "rangeway-before": "rangeway, the build before (BEFORE_BIN)",
    "pingora": "pingora alone (floor, not a peer)",
    "nginx-stream": "nginx, proxy_buffering off",
    "nginx-buffered": "nginx, buffered in memory",
    "haproxy": "HAProxy",
    "splice-floor": "splice floor (C relay, splice)",
    "copy-floor": "copy floor (C relay, read/write)",
}
COLOURS = {
    "direct": "#9e9e9e",
    "rangeway": "#d95f02",
    "rangeway-aes": "#e6ab02",
    "rangeway-gzip1": "#a6761d",
    "rangeway-before": "#fdb462",
    "pingora": "#e7298a",
    "nginx-stream": "#1b9e77",
    "nginx-buffered": "#66a61e",
    "haproxy": "#7570b3",
    "splice-floor": "#444444",
    "copy-floor": "#777777",
}
MIB = 1 << 20


def nan_median(values):
    values = [v for v in values if v == v]
    return statistics.median(values) if values else float("nan")


def load_rows(path):
    with open(path, newline="") as f:
        rows = list(csv.DictReader(f, delimiter="\t"))
    for row in rows:
        for key, value in row.items():
            if key not in ("workload", "target", "rep"):
                row[key] = float(value)
        # Captures from before the machine's time, steal and switches were recorded.
        if "machine_cpu_s" not in row:
            row["machine_cpu_s"] = row["proxy_cpu_s"] + row["origin_cpu_s"] + row["wrk_cpu_s"] + row["other_cpu_s"]
        for key in ("steal_s", "all_cpu_s", "proxy_switches", "syscalls"):
            row.setdefault(key, float("nan"))
        seconds = max(row["duration_us"], 1) / 1e6
        row["rps"] = row["requests"] / seconds
        row["mbps"] = row["bytes"] / seconds / 1e6
        row["proxy_cpu_pct"] = 100 * row["proxy_cpu_s"] / seconds
        row["origin_cpu_pct"] = 100 * row["origin_cpu_s"] / seconds
        row["wrk_cpu_pct"] = 100 * row["wrk_cpu_s"] / row["wall_s"]
        row["other_cpu_pct"] = 100 * row["other_cpu_s"] / row["wall_s"]  # in cores, as %
        # beside: req/s and latency are the small requests'; the throughput is the large
        # downloads' run beside them, and the CPU is per GB of both.
        beside = row.get("beside_bytes", 0)
        if row["workload"] == "beside":
            row["mbps"] = beside / max(row.get("beside_duration_us", 0), 1)
        moved = row["bytes"] + beside
        row["cpu_per_gb"] = row["proxy_cpu_s"] / (moved / 1e9) if moved else float("nan")
        # Every core's busy time (/proc/stat: user, nice, system, irq, softirq; steal is not ours):
        # on loopback the kernel does a byte's TCP work in whichever process's context pushes it,
        # which moves CPU between the proxy and the others but not out of this sum.
        row["machine_cpu_per_gb"] = row["machine_cpu_s"] / (moved / 1e9) if moved else float("nan")
        all_s = row["all_cpu_s"]
        # (NaN in captures from before steal was recorded: unknown, and no run is left out.)
        row["steal_pct"] = 100 * row["steal_s"] / all_s if all_s == all_s and all_s > 0 else float("nan")
        # Per MiB moved (headers included): the proxy's context switches (every thread,
        # voluntary and not, /proc/PID/task/*/status) and, in a counting run, system calls.
        mib = moved / MIB
        row["switches_per_mib"] = row["proxy_switches"] / mib if mib else float("nan")
        row["syscalls_per_mib"] = row["syscalls"] / mib if mib else float("nan")
        if not row["requests"]:
            # No response completed within the run (each takes longer than DURATION): wrk's
            # percentiles are empty, not zero.
            row["p50_us"] = row["p99_us"] = float("nan")
        row["errors"] = sum(
            row[k] for k in ("status_errors", "connect_errors", "read_errors", "write_errors", "timeouts")
        )
    return rows


def summarise(rows, steal_max=2.0):
    """(workload, target) -> medians, in the order first seen. Timed runs whose steal was above
    steal_max % are left out (each entry says how many); the counting runs give the system calls
    (their median, if several); the machine's CPU per GB above direct is the target's median less
    direct's, in the same workload."""
    groups, counted = {}, {}
    for row in rows:
        key = (row["workload"], row["target"])
        if row["rep"] == "count":
            counted.setdefault(key, []).append(row)
            continue
        groups.setdefault(key, []).append(row)
    out = {}
    for key, all_runs in groups.items():
        runs = [r for r in all_runs if not r["steal_pct"] > steal_max]
        med = lambda k: nan_median([r[k] for r in runs])  # noqa: E731
        out[key] = {
            "reps": len(runs),
            "runs": len(all_runs),
            "discarded": len(all_runs) - len(runs),
            "steal_pct": max((r["steal_pct"] for r in all_runs if r["steal_pct"] == r["steal_pct"]),
                             default=float("nan")),
            "switches_per_mib": med("switches_per_mib"),
            "syscalls_per_mib": nan_median([r["syscalls_per_mib"] for r in counted.get(key, [])]),
            "rps": med("rps"),
            "mbps": med("mbps"),
            "p50_ms": med("p50_us") / 1000,
            "p99_ms": med("p99_us") / 1000,
            "proxy_cpu_pct": med("proxy_cpu_pct"),
            "cpu_per_gb": med("cpu_per_gb"),
            "machine_cpu_per_gb": med("machine_cpu_per_gb"),
            "peak_rss_mib": max((r["proxy_peak_rss_kb"] for r in runs), default=float("nan")) / 1024,
            "errors": int(sum(r["errors"] for r in all_runs)),
            "origin_cpu_pct": med("origin_cpu_pct"),
            "wrk_cpu_pct": med("wrk_cpu_pct"),
            "load1": med("load1"),
            "other_cpu_pct": med("other_cpu_pct"),
        }
    for (workload, target), s in out.items():
        direct = out.get((workload, "direct"))
        base = direct["machine_cpu_per_gb"] if direct else float("nan")
        s["machine_above_direct"] = s["machine_cpu_per_gb"] - base
    return out


def discards(summary):
    """(runs left out for steal, runs in all) over every target and workload."""
    return (sum(s["discarded"] for s in summary.values()), sum(s["runs"] for s in summary.values()))


def foreign_load(summary):
    """The most CPU, in % of one core, that processes outside the bench took during a target's runs."""
    return max((s["other_cpu_pct"] for s in summary.values() if s["other_cpu_pct"] == s["other_cpu_pct"]), default=0)


def fmt(value, digits=1):
    if value != value:  # NaN
        return "—"
    if abs(value) >= 100 and digits <= 1:
        return f"{value:,.0f}"
    return f"{value:,.{digits}f}"


def ratio(a, b):
    if not b or a != a or b != b:  # zero or NaN: no ratio to give
        return "—"
    return f"{a / b:.2f}×"


def markdown(meta, summary, raw_name, svg_name):
    lines = [f"# Load: rangeway beside nginx and HAProxy ({meta['date'][:10]})", ""]
    foreign = foreign_load(summary)
    if foreign > 10:
        lines += [
            f"**Taken under foreign load**: other processes used up to {foreign:.0f} % of a core "
            "during these runs (column *others*); treat the figures as a check that the harness "
            "works, not as results.",
            "",
        ]
    left_out, runs = discards(summary)
    steal_max = meta.get("steal_max", "2")
    lines += [
        f"**Runs left out for steal above {steal_max} %: {left_out} of {runs}**"
        + (" (the figures of a target with none left are —)." if left_out else "."),
        "",
    ]
    params = dict(re.findall(r"\b([A-Z_]+)=(\S+)", meta["command"]))
    reps, duration = int(params.get("REPS", 0)), float(params.get("DURATION", 0))
    if reps < 5 or duration < 20:
        lines += [
            f"**Shorter than the full run** ({reps} × {duration:g} s per target, against 5 × 20 s): "
            "medians of so few, so short runs show the harness works and roughly where each proxy "
            "stands; they are not results.",
            "",
        ]
    lines += [
        f"- machine: {meta['nproc']} CPUs, {meta['cpu']}, {meta['kernel']}",
        f"- versions: rangeway {meta['rangeway']}, pingora {meta.get('pingora', '?')}, nginx {meta['nginx']}, "
        f"HAProxy {meta['haproxy']}, "
        f"wrk {meta['wrk']}",
        f"- command: `{meta['command']}`",
        f"- {meta['objects']}; {meta['runs']}; {meta['pinning']}",
        f"- floors: {meta.get('floors', '—')}",
        f"- counting runs: {meta.get('counting', '—')}; net.ipv4.tcp_notsent_lowat: "
        f"{meta.get('notsent_lowat', '?')}",
        f"- uptime before: `{meta['uptime_before'].strip()}`",
        f"- uptime after: `{meta['uptime_after'].strip()}`",
        f"- taken: {meta['date']}",
        f"- raw captures (outside the repository): `{raw_name}`, its `.meta`, the chart "
        f"`{svg_name}`",
        "",
        "Medians over the repetitions. MB/s counts what wrk received (headers included). *proxy CPU* is "
        "the proxy process's user+system time (all threads; nginx's worker, not its master) over the "
        "run, in % of one core; *CPU s/GB* the same per GB delivered; *peak RSS* its VmHWM, reset "
        "before each run (the largest over the repetitions). *errors*: non-2xx plus socket errors and "
        "timeouts, summed. *origin*/*wrk*: their CPU in % of one core (both share one core, so their "
        "sum near 100 % means the generator side, not the proxy, is the limit). *load*: 1-minute load "
        "average at the start of each run; *others*: CPU used during the run by processes that are not "
        "part of the bench, in % of one core.",
        "",
        "*machine s/GB (above direct)*: every core's busy time over the run from /proc/stat (user, "
        "nice, system, irq, softirq; not steal) per GB delivered, and in brackets that less the "
        "same figure of the direct run (wrk straight to the origin) in this workload: what relaying "
        "a GB through this target cost the machine. *syscalls/MiB*: the proxy's system calls (every "
        "thread) per MiB delivered, counted in a separate counting run after the timed ones (perf "
        "stat, raw_syscalls:sys_enter), so the timed runs are not slowed by it. *switches/MiB*: the "
        "proxy's context switches (every thread, voluntary and involuntary, from "
        "/proc/PID/task/*/status) per MiB, median of the timed runs. *steal*: the largest share of "
        "the machine's time the hypervisor took during the target's runs; runs above the limit are "
        "left out of the medians.",
        "",
    ]
    lines += compact(summary) + [""]
    for workload, title in WORKLOADS.items():
        targets = [t for (w, t) in summary if w == workload]
        if not targets:
            continue
        base_name = "rangeway"
        if workload == "chain":
            ratio_head = "÷ passthrough: MB/s, p99, CPU/GB"
        else:
            ratio_head = "rangeway ÷ this: req/s, p99, CPU/GB"
        lines += [
            f"## {title}",
            "",
            "| target | req/s | MB/s | p50 ms | p99 ms | proxy CPU | CPU s/GB | machine s/GB (above direct) "
            "| syscalls/MiB | switches/MiB | peak RSS MiB | errors "
            f"| {ratio_head} | origin | wrk | load | others | steal | runs |",
            "|---|" + "---:|" * 19,
        ]
        base = summary.get((workload, base_name))
        for target in targets:
            s = summary[(workload, target)]
            proxied = target != "direct"
            if base is None or target in ("direct", base_name):
                ratios = "—"
            elif workload == "chain":
                ratios = ", ".join(
                    (ratio(s["mbps"], base["mbps"]), ratio(s["p99_ms"], base["p99_ms"]),
                     ratio(s["cpu_per_gb"], base["cpu_per_gb"])))
            else:
                ratios = ", ".join(
                    (ratio(base["rps"], s["rps"]), ratio(base["p99_ms"], s["p99_ms"]),
                     ratio(base["cpu_per_gb"], s["cpu_per_gb"])))
            lines.append(
                "| " + " | ".join([
                    TARGET_NAMES.get(target, target),
                    fmt(s["rps"], 0),
                    fmt(s["mbps"]),
                    fmt(s["p50_ms"], 2),
                    fmt(s["p99_ms"], 2),
                    pct(s["proxy_cpu_pct"]) if proxied else "—",
                    fmt(s["cpu_per_gb"], 2) if proxied else "—",
                    machine_cell(s, proxied),
                    fmt(s["syscalls_per_mib"], 1) if proxied else "—",
                    fmt(s["switches_per_mib"], 1) if proxied else "—",
                    fmt(s["peak_rss_mib"]) if proxied else "—",
                    str(s["errors"]),
                    ratios,
                    pct(s["origin_cpu_pct"]),
                    pct(s["wrk_cpu_pct"]),
                    fmt(s["load1"], 2),
                    pct(s["other_cpu_pct"]),
                    "—" if s["steal_pct"] != s["steal_pct"] else f"{s['steal_pct']:.1f} %",
                    f"{s['reps']} of {s['runs']}",
                ]) + " |"
            )
        lines.append("")
    return "\n".join(lines)


def pct(value):
    return "—" if value != value else f"{value:.0f} %"


def machine_cell(s, proxied):
    """The machine's CPU s/GB, and above direct's in brackets (direct: the base itself)."""
    if not proxied:
        return f"{fmt(s['machine_cpu_per_gb'], 2)} (base)"
    above = s["machine_above_direct"]
    return f"{fmt(s['machine_cpu_per_gb'], 2)} ({'—' if above != above else f'{above:+.2f}'})"


def compact(summary):
    """One short table of every workload, the form the README's Measured section quotes."""
    lines = [
        "## Summary",
        "",
        "| workload | target | req/s | MB/s | p99 ms | CPU s/GB | machine s/GB above direct "
        "| syscalls/MiB | switches/MiB | peak RSS MiB | errors | rangeway ÷ this | load, others |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for workload in WORKLOADS:
        for (w, target), s in summary.items():
            if w != workload:
                continue
            base = summary.get((workload, "rangeway"))
            if base is None or target in ("direct", "rangeway"):
                rel = "—"
            elif workload == "chain":  # the route against passthrough, in bytes delivered
                rel = ratio(s["mbps"], base["mbps"]) + " MB/s (route ÷ passthrough)"
            else:
                rel = ratio(base["rps"], s["rps"]) + " req/s"
            proxied = target != "direct"
            lines.append("| " + " | ".join([
                workload, TARGET_NAMES.get(target, target), fmt(s["rps"], 0), fmt(s["mbps"]),
                fmt(s["p99_ms"], 1), fmt(s["cpu_per_gb"], 2) if proxied else "—",
                fmt(s["machine_above_direct"], 2) if proxied else f"(base {fmt(s['machine_cpu_per_gb'], 2)})",
                fmt(s["syscalls_per_mib"], 1) if proxied else "—",
                fmt(s["switches_per_mib"], 1) if proxied else "—",
                fmt(s["peak_rss_mib"], 0) if proxied else "—", str(s["errors"]), rel,
                f"{fmt(s['load1'], 1)}, {pct(s['other_cpu_pct'])}",
            ]) + " |")
    return lines


def svg(meta, summary):
    """One row of two bar panels per workload: throughput, and p99 latency."""
    workloads = [w for w in WORKLOADS if any(k[0] == w for k in summary)]
    panel_w, bar_h, gap, label_w, top = 480, 18, 4, 220, 60
    rows = []
    for workload in workloads:
        targets = [t for (w, t) in summary if w == workload]
        rows.append((workload, targets, 30 + len(targets) * (bar_h + gap)))
    width = 2 * panel_w + 20
    height = top + sum(h + 20 for _, _, h in rows) + 10
    out = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
        f'font-family="sans-serif" font-size="12">',
        f'<rect width="{width}" height="{height}" fill="white"/>',
        f'<text x="10" y="22" font-size="15" font-weight="bold">rangeway load bench, '
        f'{html.escape(meta["date"][:16])}</text>',
        f'<text x="10" y="42" fill="#555">medians of {html.escape(meta["runs"].split(" repetitions")[0])} '
        f'runs; before: {html.escape(meta["uptime_before"].strip())}'
        f'{" — TAKEN UNDER FOREIGN LOAD" if foreign_load(summary) > 10 else ""}</text>',
    ]
    y = top
    for workload, targets, h in rows:
        # Small objects: the request rate is the throughput that matters; bytes elsewhere.
        metric, unit = ("rps", "req/s") if workload in ("small", "beside") else ("mbps", "MB/s")
        for col, (key, title) in enumerate(((metric, f"{workload}: {unit}"), ("p99_ms", f"{workload}: p99 ms"))):
            x0 = 10 + col * (panel_w + 10)
            out.append(f'<text x="{x0}" y="{y + 14}" font-weight="bold">{html.escape(title)}</text>')
            values = [summary[(workload, t)][key] for t in targets]
            peak = max((v for v in values if v == v), default=0) or 1
            for i, target in enumerate(targets):
                value = summary[(workload, target)][key]
                by = y + 24 + i * (bar_h + gap)
                # NaN (no response completed): no bar, labelled —.
                bw = (panel_w - label_w - 70) * value / peak if value == value else 0.0
                out.append(f'<text x="{x0 + label_w - 6}" y="{by + 13}" text-anchor="end">'
                           f'{html.escape(TARGET_NAMES.get(target, target))}</text>')
                out.append(f'<rect x="{x0 + label_w}" y="{by}" width="{bw:.1f}" height="{bar_h}" '
                           f'fill="{COLOURS.get(target, "#333")}"/>')
                out.append(f'<text x="{x0 + label_w + bw + 4:.1f}" y="{by + 13}">{fmt(value, 2 if key == "p99_ms" else 0)}</text>')
        y += h + 20
    out.append("</svg>")
    return "\n".join(out) + "\n"


def main():
    raw_path, meta_path, md_path, svg_path = sys.argv[1:5]
    with open(meta_path) as f:
        meta = dict(line.rstrip("\n").split("\t", 1) for line in f if "\t" in line)
    summary = summarise(load_rows(raw_path), float(meta.get("steal_max", 2)))
    with open(md_path, "w") as f:
        f.write(markdown(meta, summary, raw_path, svg_path))
    with open(svg_path, "w") as f:
        f.write(svg(meta, summary))


if __name__ == "__main__":
    main()
