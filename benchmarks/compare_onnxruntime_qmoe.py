#!/usr/bin/env python3
"""libqmoe's MoE layer against ONNX Runtime's com.microsoft.QMoE CPU operator: same weights,
same router logits, same process.

The layer is Qwen3-30B-A3B's: E = 128 experts, top-8, H = 2048, I = 768, INT4 with block 32
(no zero points: 8), FP16-representable FP32 scales, swiglu_fusion = 1 (gate/up interleaved
rows), SiLU (alpha 1, beta 0, no limit). For M = 1 and 4 tokens and every thread count from 1
to the number of hardware threads, the script

  * builds R independent random layers (python/ort_qmoe.py QMoELayer), R >= 2 and R x layer
    bytes >= 4 x L3, and gives the same bytes to both sides: ORT gets one model of R QMoE nodes
    sharing inputs X and router logits (one run = R layers; sessions with
    intra_op_num_threads = t, accuracy_level 0 and 4), libqmoe R expert sets (codes through
    qmoe_import_int4_onnx into huge-page weight memory, the same scales as FP16 planes in the
    grouped order, the form `qmoe run` uses; --qmoe-scales f16 gives FP16 [K/32, N] planes,
    f32 reads ORT's own FP32 [N, K/32] planes in place; a context of t threads) run with qmoe_moe_forward_logits (k = 8, renormalize = 1), R calls in a Python
    loop;
  * keeps the weights cold: before every timed run (outside the timing) fresh router logits
    are written into the buffer both sides read, so each run routes to new experts of R layers
    whose weights together are several times the L3; every side sees the same logit sequence;
  * times the median of runs, divided by R x M: microseconds per token and layer;
  * checks, on layer 0 for every M (assert, as tests/python/onnxruntime_qmoe_test.py does with
    python/qmoe_parity.py): each output against an FP64 reference within the bounds of
    docs/abi.md, and libqmoe exact against ORT level 0, libqmoe fast against ORT level 4;
  * prints a table with the ratios ORT time / libqmoe time (> 1: libqmoe is faster).

Pairing: libqmoe exact with ORT accuracy_level 0 (FP32 activations), libqmoe fast with ORT
accuracy_level 4 (int8 activations per 32 k on both sides at block 32).

--activations f16 runs the layer on FP16 activations: ORT's QMoE with T = float16 (X, router
logits, scales and Y in FP16), libqmoe's qmoe_moe_forward_logits_typed (QMOE_DTYPE_F16) on the
same FP16 buffers; the checks add the rounding of Y to FP16 to every bound.

Usage:
  pip install onnxruntime onnx numpy
  python3 benchmarks/compare_onnxruntime_qmoe.py build/lib/libqmoe.so [--quick] [--gate] ...
"""

import argparse
import math
import os
import statistics
import sys
import time

import numpy as np

try:
    import onnx
    import onnxruntime as ort
except ImportError as error:  # pragma: no cover
    sys.exit(f"compare_onnxruntime_qmoe.py needs onnx and onnxruntime ({error}); "
             "pip install onnxruntime onnx numpy")

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "python"))
import libqmoe  # noqa: E402
import ort_qmoe  # noqa: E402
import qmoe_parity  # noqa: E402
from benchutil import (Gate, add_method_arguments, hardware_threads, l3_bytes,  # noqa: E402
                       median_time)

EXPERTS, TOP_K, HIDDEN, INTER, BLOCK = 128, 8, 2048, 768, 32
SWIGLU = ort_qmoe.QWEN3_SWIGLU


def parse_threads(text, all_threads):
    """'all' (1 .. all_threads) or a comma-separated list."""
    if text == "all":
        return list(range(1, all_threads + 1))
    return [int(t) for t in text.split(",")]


def fresh_logits(logits, seed):
    """A prepare() that writes the next router logits of a fixed random sequence into
    `logits` in place (the same sequence for every side measured with the same seed)."""
    stream = np.random.default_rng(seed)

    def prepare():
        logits[...] = 2.0 * stream.standard_normal(logits.shape)
    return prepare


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("libqmoe", help="path to libqmoe.so, e.g. build/lib/libqmoe.so")
    parser.add_argument("--m", default="1,4", help="tokens per forward, comma-separated")
    parser.add_argument("--threads", default="all",
                        help="'all' (every count from 1 to the hardware threads, default) or "
                             "a comma-separated list")
    parser.add_argument("--layers", type=int, default=0,
                        help="R, the layers rotated (default: >= 2 and >= 4 x L3 of weights)")
    parser.add_argument("--runs", type=int, default=15,
                        help="timed runs (of all R layers) per measurement and round")
    add_method_arguments(parser)
    parser.add_argument("--qmoe-scales", choices=("grouped", "f16", "f32"), default="grouped",
                        help="libqmoe's weights: FP16 scales in the grouped order with codes in "
                             "huge-page weight memory (default; what qmoe run uses), FP16 "
                             "[K/32, N] planes, or ORT's own FP32 [N, K/32] planes in place")
    parser.add_argument("--activations", choices=("f32", "f16"), default="f32",
                        help="type of X, the router logits and Y on both sides (default f32)")
    parser.add_argument("--quick", action="store_true",
                        help="5 runs, 1 round: a smoke test with rough figures")
    args = parser.parse_args()
    if args.quick:
        args.runs, args.rounds = 5, 1

    qmoe = libqmoe.Library(args.libqmoe)
    gate = Gate(args.gate)
    thread_counts = parse_threads(args.threads, hardware_threads())
    ms = [int(v) for v in args.m.split(",")]

    rng = np.random.default_rng(30)
    first = ort_qmoe.QMoELayer(EXPERTS, HIDDEN, INTER, BLOCK, rng)
    count = args.layers or max(2, math.ceil(4 * l3_bytes() / first.nbytes))
    layers = [first] + [ort_qmoe.QMoELayer(EXPERTS, HIDDEN, INTER, BLOCK, rng)
                        for _ in range(count - 1)]
    fp16_scales = {"grouped": "grouped", "f16": True, "f32": False}[args.qmoe_scales]
    sets = [layer.expert_set(qmoe, SWIGLU, fp16_scales=fp16_scales) for layer in layers]
    ort_expert, qmoe_expert = first.nbytes / EXPERTS, sets[0].nbytes / EXPERTS
    print(f"onnxruntime {ort.__version__} (onnx {onnx.__version__}), libqmoe {qmoe.version()} "
          f"({args.libqmoe}), numpy {np.__version__}")
    print(f"Qwen3-30B-A3B MoE layer: E={EXPERTS} top-{TOP_K} H={HIDDEN} I={INTER} INT4 block "
          f"{BLOCK}, swiglu_fusion=1. Bytes per expert (codes + scales): ORT "
          f"{ort_expert / 2**20:.2f} MiB (FP32 scales), libqmoe {qmoe_expert / 2**20:.2f} MiB "
          f"({args.qmoe_scales.upper()} scales); per token at M=1, x {TOP_K}")
    print(f"R = {count} layers rotated: {count * first.nbytes / 2**20:.0f} MiB of weights in "
          f"ORT's form, {count * sets[0].nbytes / 2**20:.0f} MiB in libqmoe's (L3 "
          f"{l3_bytes() >> 20} MiB); fresh router logits before every run; median of "
          f"{args.runs} runs x {args.rounds} round(s)")

    # Shared input buffers: ORT binds them without copying, libqmoe reads them in place.
    fp16 = args.activations == "f16"
    dtype = np.float16 if fp16 else np.float32
    print(f"activations {args.activations}" + (" (ORT QMoE T = float16, libqmoe "
                                               "qmoe_moe_forward_logits_typed)" if fp16 else ""))
    xs = {m: rng.uniform(-1.0, 1.0, size=(m, HIDDEN)).astype(dtype) for m in ms}
    logits = {m: np.zeros((m, EXPERTS), dtype=dtype) for m in ms}
    check_logits = {m: qmoe_parity.draw_logits(rng, m, EXPERTS, TOP_K, dtype) for m in ms}
    models = {level: ort_qmoe.qmoe_model(layers, TOP_K, SWIGLU, level, dtype) for level in (0, 4)}



    rows = []
    checked = False
    for t in thread_counts:
        ctx = qmoe.context(t)
        runners = {level: ort_qmoe.QMoERunner(models[level], t, count, HIDDEN)
                   for level in (0, 4)}
        if not checked:
            # Correctness on layer 0, with this thread count (libqmoe's result does not depend
            # on it; ORT's combine order does, within the bound).
            for m in ms:
                x, lg = xs[m], check_logits[m]
                outputs = {
                    qmoe_parity.QMOE_EXACT: qmoe.moe_forward_logits(
                        ctx, sets[0], libqmoe.QMOE_ACCURACY_EXACT, x, lg, TOP_K),
                    qmoe_parity.QMOE_FAST: qmoe.moe_forward_logits(
                        ctx, sets[0], libqmoe.QMOE_ACCURACY_FAST, x, lg, TOP_K),
                    qmoe_parity.ORT_LEVEL0: runners[0].forward(x, lg)[0],
                    qmoe_parity.ORT_LEVEL4: runners[4].forward(x, lg)[0],
                }
                results, _ = qmoe_parity.check_outputs(
                    first, SWIGLU, x.astype(np.float32), lg.astype(np.float32), TOP_K, outputs,
                    fp16=fp16)
                print(f"  check M={m}: worst error / bound: " +
                      ", ".join(f"{name} {ratio:.2g}" for name, ratio in results))
                bad = [f"{name}: {ratio:.3g} x the bound" for name, ratio in results
                       if not ratio <= 1.0]
                assert not bad, f"M={m}: outputs disagree: " + "; ".join(bad)
            print(f"checks passed ({ctx.isa}, {t} thread(s))")
            checked = True

        samples = {}
        for _ in range(args.rounds):
            for m in ms:
                x, lg = xs[m], logits[m]
                per_run = count * m
                for level in (0, 4):
                    runners[level].bind(x, lg)
                    samples.setdefault((m, f"ort{level}"), []).append(gate.measure(
                        lambda: median_time(runners[level].run, 0.0, args.runs, per_run,
                                            fresh_logits(lg, m))))
                time.sleep(0.02)  # let ORT's spinning workers park
                for acc in (libqmoe.QMOE_ACCURACY_EXACT, libqmoe.QMOE_ACCURACY_FAST):
                    calls = [qmoe.forward_logits_call(ctx, s, acc, x, lg, TOP_K,
                                                      np.zeros_like(x)) for s in sets]

                    def rotation():
                        for call in calls:
                            call()
                    samples.setdefault((m, libqmoe.ACCURACY_NAMES[acc]), []).append(
                        gate.measure(lambda: median_time(rotation, 0.0, args.runs, per_run,
                                                         fresh_logits(lg, m))))
                time.sleep(0.05)  # and libqmoe's pool workers
        for m in ms:
            rows.append((m, t, {key: statistics.median(v) for (mm, key), v in samples.items()
                                if mm == m}))
        runners.clear()  # free this thread count's sessions before the next ones
        ctx.close()
        time.sleep(0.05)

    print()
    if gate.enabled:
        print(f"--gate: {gate.repeated} measurements repeated after interference, "
              f"{gate.disturbed} kept although still disturbed")
    print("Times in us per token and layer (median; cold weights). ratio = ORT / qmoe: > 1 "
          "means libqmoe is faster.")
    print("exact pairs with ORT accuracy_level 0, fast with accuracy_level 4.")
    header = (f"{'M':>2} {'thr':>3}   {'ORT lvl0':>10} {'qmoe exact':>10} {'ratio':>6}   "
              f"{'ORT lvl4':>10} {'qmoe fast':>10} {'ratio':>6}")
    print(header)
    print("-" * len(header))
    for m, t, times in rows:
        cells = []
        for ort_key, qmoe_key in (("ort0", "exact"), ("ort4", "fast")):
            cells.append(f"{times[ort_key] * 1e6:10.1f} {times[qmoe_key] * 1e6:10.1f} "
                         f"{times[ort_key] / times[qmoe_key]:6.2f}")
        print(f"{m:>2} {t:>3}   " + "   ".join(cells))
    for s in sets:
        s.close()


if __name__ == "__main__":
    main()
