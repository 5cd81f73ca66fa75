#!/usr/bin/python3
"""PNG plots of qmoe_bench runs (Google Benchmark JSON) and of `qmoe run --json` reports.

  qmoe_bench --benchmark_out=bench.json --benchmark_out_format=json
  for t in 1 2 4 8 16; do qmoe run --layers 48 --tokens 8 --threads $t --json > decode-$t.json; done
  /usr/bin/python3 benchmarks/plot_benchmarks.py --out docs/plots bench.json decode-*.json

Each plot is drawn when the inputs hold its rows, and skipped (with a line saying so) otherwise:
  gemm_int4_roof.png        cold gemm_int4 rows: fraction of the same run's read roof per shape,
                            tier and level, one panel per M and thread count; the M = 1 panels
                            add the read_only rows (the same pages read alone) and issue 3's bars
  gemm_int4_m4_over_m1.png  fast, cold, one thread: time(M = 4) / time(M = 1), bar 1.30
  moe_layer_roof.png        moe_layer rows (INT4): fraction of the read roof per thread count
  convert_roof.png          DRAM-sized conversions: fraction of the read roof per tier
  decode_threads.png        qmoe run reports: the ratio against the read roof (and against the
                            weights' own pages) and ms per layer, per thread count
Every figure is a ratio within one process (docs/benchmarks.md says why). With several inputs
of the same rows (several processes), a bar is their median and its whisker their range. With
--benchmark_repetitions, a row's median aggregate stands for it.

matplotlib comes from Debian: `apt-get install python3-matplotlib`, then run this script with
/usr/bin/python3 (a pyenv or virtualenv python3 does not see Debian's packages).
"""

import argparse
import json
import os
import statistics
import sys

# Issue 3's bars, defined once beside the tables that judge them.
from gemm_int4_summary import FRACTION_BARS, M4_OVER_M1_LIMIT

DECODE_BAR = 0.80  # decode within 1.25x of bytes over the roof


def load_pyplot():
    try:
        import matplotlib
    except ImportError:
        sys.exit("plot_benchmarks.py needs matplotlib: on Debian, `apt-get install -y "
                 "python3-matplotlib` and run it with /usr/bin/python3 (a pyenv or virtualenv "
                 "python3 does not see Debian's packages).")
    matplotlib.use("Agg")  # files only, no display
    import matplotlib.pyplot as plt
    return plt


# --- Inputs ------------------------------------------------------------------------------------


class BenchmarkRun:
    """One qmoe_bench process: its context and {name without /manual_time: row}."""

    def __init__(self, data):
        self.context = data.get("context", {})
        self.rows = {}
        medians = set()
        for b in data["benchmarks"]:
            name = b.get("run_name", b["name"]).removesuffix("/manual_time")
            if b.get("run_type") == "aggregate":
                if b.get("aggregate_name") == "median":
                    self.rows[name] = b
                    medians.add(name)
            elif name not in medians:
                self.rows[name] = b
        self.rows = {n: b for n, b in self.rows.items() if not b.get("error_occurred")}

    def threads_label(self, threads):
        if threads != "all":
            return threads
        return f"all ({self.context.get('qmoe_hardware_threads', '?')})"


def load(paths):
    """Benchmark runs, qmoe run reports and qmoe cache reports, told apart by their content."""
    runs, decodes, caches = [], [], []
    for path in paths:
        with open(path) as f:
            data = json.load(f)
        if "benchmarks" in data:
            runs.append(BenchmarkRun(data))
        elif data.get("command") == "run":
            decodes.append(data)
        elif data.get("command") == "cache":
            caches.append(data)
        else:
            sys.exit(f"{path}: neither a Google Benchmark JSON run nor a `qmoe run --json` or "
                     "`qmoe cache --json` report")
    return runs, decodes, caches


def collect(runs, parse, counter="frac_of_read_bw"):
    """{key: [value per run]} for the rows whose name parse() turns into a key, and the runs
    that gave any."""
    values, used = {}, []
    for run in runs:
        for name, row in run.rows.items():
            key = parse(name.split("/"), run)
            if key is not None and counter in row:
                values.setdefault(key, []).append(row[counter])
                if run not in used:
                    used.append(run)
    return values, used


def subtitle(runs):
    first = runs[0].context
    roofs = [f"{r.context.get('qmoe_read_roof_1_thread_GB/s', '?')} / "
             f"{r.context.get('qmoe_read_roof_all_threads_GB/s', '?')}" for r in runs]
    text = (f"{first.get('host_name', '?')}, {first.get('date', '?')[:10]}, "
            f"read roof {'; '.join(roofs)} GB/s (1 / all threads)")
    if len(runs) > 1:
        text += f"\nmedian of {len(runs)} processes, whiskers: their range"
    return text


# --- Drawing -----------------------------------------------------------------------------------


def palette(names):
    """One colour per name, the same in every panel of a figure."""
    return {name: f"C{i % 10}" for i, name in enumerate(sorted(set(names)))}


def grouped_bars(ax, groups, series, values, ylabel, colors):
    """Bars of the median of values[(group, series)], grouped by group, one colour a series,
    the range over runs as a whisker and the median written above each bar."""
    if not series:
        ax.text(0.5, 0.5, "no rows", ha="center", va="center", transform=ax.transAxes)
        return
    width = 0.8 / len(series)
    for i, name in enumerate(series):
        xs, heights, low, high = [], [], [], []
        for g, group in enumerate(groups):
            v = values.get((group, name))
            if not v:
                continue
            median = statistics.median(v)
            xs.append(g + (i - (len(series) - 1) / 2) * width)
            heights.append(median)
            low.append(median - min(v))
            high.append(max(v) - median)
        hatch = "//" if name.endswith("read_only") else None
        bars = ax.bar(xs, heights, width, label=name, hatch=hatch, color=colors[name],
                      yerr=[low, high] if any(low) or any(high) else None, capsize=2)
        ax.bar_label(bars, fmt="%.2f", fontsize=6, padding=1)
    ax.set_xticks(range(len(groups)), groups)
    ax.set_ylabel(ylabel)
    ax.grid(axis="y", alpha=0.3)
    ax.legend(fontsize=7, loc="upper left", ncol=3)


def headroom(axes):
    """One y range for all the axes, with room above the tallest bar for the legend."""
    top = max(ax.get_ylim()[1] for ax in axes) * 1.35
    for ax in axes:
        ax.set_ylim(0, top)


def bar_line(ax, value, label):
    ax.axhline(value, color="black", linestyle="--", linewidth=0.8)
    ax.annotate(label, (1.0, value), xycoords=("axes fraction", "data"), ha="right",
                va="bottom", fontsize=7)


def save(plt, fig, out, name):
    path = os.path.join(out, name)
    fig.savefig(path, dpi=120, bbox_inches="tight")
    plt.close(fig)
    print(f"wrote {path}")


def ordered(keys, position):
    """Distinct values of key[position], in the order first seen."""
    return list(dict.fromkeys(k[position] for k in keys))


# --- Plots -------------------------------------------------------------------------------------


def plot_gemm_roof(plt, runs, out):
    # (m, threads, shape, series), series "<tier>/<level>" or "<tier>/read_only"; M = 1 and 4,
    # the Ms of issue 3's bars (gemm_int4_summary.py prints every M)
    def parse(parts, run):
        if parts[0] != "gemm_int4" or parts[-2] != "cold" or parts[2] == "scalar":
            return None
        threads = run.threads_label(parts[-1].removeprefix("threads:"))
        if parts[3] == "read_only":
            return ("1", threads, parts[1], f"{parts[2]}/read_only")
        m = parts[4].removeprefix("m:")
        return (m, threads, parts[1], f"{parts[2]}/{parts[3]}") if m in ("1", "4") else None

    values, used = collect(runs, parse)
    gemm_keys = [k for k in values if not k[3].endswith("read_only")]
    if not gemm_keys:
        return "no cold gemm_int4 rows at M = 1 or 4"
    ms = sorted(set(k[0] for k in gemm_keys), key=int)
    threads = ordered(values, 1)
    colors = palette(k[3] for k in values)
    fig, axes = plt.subplots(len(ms), len(threads), squeeze=False, layout="constrained",
                             figsize=(6.5 * len(threads), 3.6 * len(ms)))
    for r, m in enumerate(ms):
        for c, t in enumerate(threads):
            ax = axes[r][c]
            cell = {(k[2], k[3]): v for k, v in values.items() if k[0] == m and k[1] == t}
            if m != "1":
                cell = {k: v for k, v in cell.items() if not k[1].endswith("read_only")}
            grouped_bars(ax, ordered(cell, 0), sorted(set(k[1] for k in cell)), cell,
                         "fraction of the read roof", colors)
            ax.set_title(f"M = {m}, threads {t}", fontsize=9)
            if m == "1":
                for what, level, bar_threads, limit in FRACTION_BARS:
                    if t.split(" ")[0] == bar_threads:
                        bar_line(ax, limit, f"{level} bar {limit:.2f}")
    headroom(list(axes.flat))
    fig.suptitle("gemm_int4, cold weights: GB/s over the same process's read roof\n" +
                 subtitle(used), fontsize=10)
    save(plt, fig, out, "gemm_int4_roof.png")
    return None


def m4_over_m1(runs):
    """{(shape, tier): [time(M = 4) / time(M = 1) per run]} of the fast, cold, one-thread
    gemm_int4 rows, each ratio taken within one process, and the runs that gave any."""
    def parse(parts, run):
        if (parts[0] != "gemm_int4" or len(parts) != 7 or parts[3] != "fast"
                or parts[5] != "cold" or parts[6] != "threads:1"):
            return None
        return (parts[4].removeprefix("m:"), parts[1], parts[2])

    ratios, used = {}, []
    for run in runs:
        times, _ = collect([run], parse, "us_per_call")
        for (m, shape, tier), v in times.items():
            base = times.get(("1", shape, tier))
            if m == "4" and base:
                ratios.setdefault((shape, tier), []).append(v[0] / base[0])
                if run not in used:
                    used.append(run)
    return ratios, used


def plot_gemm_m4_over_m1(plt, runs, out):
    ratios, used = m4_over_m1(runs)
    if not ratios:
        return "no fast cold one-thread gemm_int4 rows at both M = 1 and M = 4"
    fig, ax = plt.subplots(figsize=(6.5, 3.6), layout="constrained")
    grouped_bars(ax, ordered(ratios, 0), sorted(set(k[1] for k in ratios)), ratios,
                 "time(M = 4) / time(M = 1)", palette(k[1] for k in ratios))
    bar_line(ax, M4_OVER_M1_LIMIT, f"bar {M4_OVER_M1_LIMIT:.2f}")
    headroom([ax])
    fig.suptitle("gemm_int4, fast, cold, one thread: what a token more costs\n" + subtitle(used),
                 fontsize=10)
    save(plt, fig, out, "gemm_int4_m4_over_m1.png")
    return None


def plot_moe_layer(plt, runs, out):
    def parse(parts, run):
        if parts[0] != "moe_layer" or parts[1] != "qwen3":  # INT4; qwen3_<format> for the others
            return None
        return (run.threads_label(parts[-1].removeprefix("threads:")),
                f"{parts[2]}/{parts[3]}/{parts[4].replace(':', ' = ')}")

    values, used = collect(runs, parse)
    if not values:
        return "no moe_layer rows"
    fig, ax = plt.subplots(figsize=(6.5, 3.6), layout="constrained")
    grouped_bars(ax, ordered(values, 0), sorted(set(k[1] for k in values)), values,
                 "fraction of the read roof", palette(k[1] for k in values))
    ax.set_xlabel("threads")
    headroom([ax])
    fig.suptitle("moe_layer (Qwen3-30B-A3B layer, top-8), cold experts\n" + subtitle(used),
                 fontsize=10)
    save(plt, fig, out, "moe_layer_roof.png")
    return None


def plot_convert(plt, runs, out):
    def parse(parts, run):
        if not parts[0].startswith("convert_") or parts[2] != "dram":
            return None
        threads = run.threads_label(parts[3].removeprefix("threads:"))
        return (parts[0].removeprefix("convert_"), f"{parts[1]}, threads {threads}")

    values, used = collect(runs, parse)
    if not values:
        return "no DRAM-sized convert rows"
    fig, ax = plt.subplots(figsize=(6.5, 3.6), layout="constrained")
    grouped_bars(ax, ordered(values, 0), sorted(set(k[1] for k in values)), values,
                 "fraction of the read roof", palette(k[1] for k in values))
    headroom([ax])
    fig.suptitle("Conversions, DRAM-sized rows: (src + dst) bytes/s over the read roof\n" +
                 subtitle(used), fontsize=10)
    save(plt, fig, out, "convert_roof.png")
    return None


def plot_decode(plt, decodes, out):
    series = {}  # (tier, accuracy, activations) -> {threads: [report]}
    for d in decodes:
        key = (d["tier"], d["accuracy"], d.get("activations", "f32"))
        series.setdefault(key, {}).setdefault(d["threads"], []).append(d)
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 3.8), layout="constrained")
    all_threads = sorted(set(d["threads"] for d in decodes))
    for (tier, accuracy, activations), by_threads in sorted(series.items()):
        threads = sorted(by_threads)
        name = f"{tier}/{accuracy}/{activations}"
        for field, style, what in (("bandwidth_ratio", "o-", "read roof"),
                                   ("weights_bandwidth_ratio", "s:", "weights' pages")):
            medians = [statistics.median(r[field] for r in by_threads[t]) for t in threads]
            left.plot(threads, medians, style, label=f"{name}, against the {what}")
        right.plot(threads, [statistics.median(r["timing"]["ms_per_layer"] for r in by_threads[t])
                             for t in threads], "o-", label=name)
    bar_line(left, DECODE_BAR, f"bar {DECODE_BAR:.2f}")
    left.set_ylabel("bytes / roof over time (ratio)")
    right.set_ylabel("ms per layer")
    for ax in (left, right):
        ax.set_xlabel("threads")
        ax.set_xscale("log", base=2)
        ax.set_xticks(all_threads, [str(t) for t in all_threads])
        ax.minorticks_off()
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    first = decodes[0]
    layers = first["model"]["layers"]
    fig.suptitle(f"qmoe run --layers {layers} (decode, M = 1): median per thread count\n"
                 f"{first['cpu']}, {len(decodes)} report(s)", fontsize=10)
    save(plt, fig, out, "decode_threads.png")
    return None


def plot_cache(plt, caches, out):
    """Steady-state hit rate and copies a step against the residency, one line per policy and
    one column per routing, from `qmoe cache --json` reports."""
    routings = sorted(set(c["trace"]["routing"] for c in caches))
    series = {}  # (routing, policy) -> {residency: (hit rate, copies a step)}
    for c in caches:
        for p in c["policies"]:
            series.setdefault((c["trace"]["routing"], p["policy"]), {})[
                c["cache"]["residency"]] = (p["steady_hit_rate"], p["steady_promotions_per_step"])
    colors = palette(policy for _, policy in series)
    fig, axes = plt.subplots(2, len(routings), figsize=(4.2 * len(routings), 6.2),
                             layout="constrained", squeeze=False)
    for column, routing in enumerate(routings):
        hits, copies = axes[0][column], axes[1][column]
        for (r, policy), points in sorted(series.items()):
            if r != routing:
                continue
            residencies = sorted(points)
            hits.plot(residencies, [points[f][0] for f in residencies], "o-",
                      color=colors[policy], label=policy)
            if any(points[f][1] > 0 for f in residencies):  # static placements copy none
                copies.plot(residencies, [max(points[f][1], 1e-2) for f in residencies], "o-",
                            color=colors[policy], label=policy)
        hits.set_title(f"{routing} routing", fontsize=9)
        hits.set_ylabel("hit rate (steady state)")
        copies.set_ylabel("experts copied a step (steady; static: 0)")
        copies.set_yscale("log")
        for ax in (hits, copies):
            ax.set_xlabel("resident fraction of each layer's experts")
            ax.grid(alpha=0.3)
        hits.legend(fontsize=7)
    first = caches[0]
    fig.suptitle(f"qmoe cache: {first['model']['name']}, {first['model']['layers']} layers, "
                 f"{first['trace']['steps']} steps, {first['trace']['tokens_per_step']} "
                 f"token(s) a step; {len(caches)} report(s)", fontsize=10)
    save(plt, fig, out, "cache_policies.png")
    return None


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("inputs", nargs="+",
                        help="qmoe_bench --benchmark_out JSON files, qmoe run --json and "
                        "qmoe cache --json reports")
    parser.add_argument("--out", default="docs/plots", help="folder for the PNGs "
                        "(default docs/plots)")
    args = parser.parse_args()
    runs, decodes, caches = load(args.inputs)
    plt = load_pyplot()
    os.makedirs(args.out, exist_ok=True)
    for name, draw, source in (("gemm_int4_roof.png", plot_gemm_roof, runs),
                               ("gemm_int4_m4_over_m1.png", plot_gemm_m4_over_m1, runs),
                               ("moe_layer_roof.png", plot_moe_layer, runs),
                               ("convert_roof.png", plot_convert, runs),
                               ("decode_threads.png", plot_decode, decodes),
                               ("cache_policies.png", plot_cache, caches)):
        skipped = draw(plt, source, args.out) if source else "no input of its kind (see --help)"
        if skipped:
            print(f"skipped {name}: {skipped}")


if __name__ == "__main__":
    main()
