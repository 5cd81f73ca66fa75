#!/usr/bin/env python3
"""libqmoe's INT4 dequant-GEMM against ONNX Runtime's MatMulNBits, same weights, same process.

For each expert shape (Qwen3-30B-A3B FC1 and FC2, a gpt-oss-20b-like 2880 x 2880), M = 1 and
4, and 1 and all hardware threads, this script

  * builds one-node ONNX models with com.microsoft.MatMulNBits (bits=4, block_size=32, no zero
    points, float scales) for accuracy_level 0 (fp32 compute) and 4 (int8 activations), with
    random uint8 B [N, K/32, 16] (code k of a row: byte k/2, low nibble for even k) and FP16-
    representable scales [N, K/32];
  * imports the SAME bytes into libqmoe's canonical layout (qmoe_import_int4_onnx through
    ctypes, python/libqmoe.py) with the same scales as FP16 in [K/32, N] order (the order of
    the qwen3_fc1_kn_scales rows of qmoe_bench; --qmoe-scales f32 passes the float32 [N, K/32] plane ORT reads
    instead), and runs qmoe_gemm at the exact and fast levels;
  * times both the same way: warm = one matrix called again and again, median of per-call
    times; cold = a rotation through R distinct weight sets, R x bytes >= 4 x L3, so that every
    call reads its weights from DRAM (ORT: one model with R MatMulNBits nodes sharing input A,
    one run = R products; libqmoe: R qmoe_gemm calls in a Python loop; median of runs / R);
  * checks the outputs: each side against an FP64 reference with libqmoe's documented bounds
    (exact: 1e-5 * sum|x w|; fast: the activation-quantization bound of docs/formats.md), and
    qmoe exact vs ORT level 0, qmoe fast vs ORT level 4 (assert);
  * prints a table of times and the ratios ORT time / qmoe time (> 1: libqmoe is faster).

Pairing: qmoe exact is compared with ORT accuracy_level 0 (both fp32 activations), qmoe fast
with ORT accuracy_level 4 (both int8 activations per block of 32 k).

Usage:
  pip install onnxruntime onnx numpy
  python3 benchmarks/compare_onnxruntime.py build/lib/libqmoe.so [--quick] [--no-cold] ...

Timing notes: both sides are called from Python. A warm ORT call pays the Python binding of
InferenceSession.run_with_iobinding (inputs and outputs pre-bound, no allocation); a qmoe call
pays one ctypes call. The script measures both fixed costs (ORT: a trivial one-node model;
libqmoe: an 8 x 32 product) and prints them, so small warm figures can be read with them in
mind. In the cold rows ORT's per-run cost is spread over R nodes (what a real graph pays per
node remains). On a shared host, --gate repeats measurements that other processes disturbed.
"""

import argparse
import math
import os
import statistics
import sys
import time
import zlib

import numpy as np

try:
    import onnx
    import onnxruntime as ort
    from onnx import TensorProto, helper, numpy_helper
except ImportError as error:  # pragma: no cover
    sys.exit(f"compare_onnxruntime.py needs onnx and onnxruntime ({error}); "
             "pip install onnxruntime onnx numpy")

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "python"))
import libqmoe  # noqa: E402
from benchutil import (Gate, add_method_arguments, hardware_threads, l3_bytes,  # noqa: E402
                       median_time)
from libqmoe import QMOE_ACCURACY_EXACT, QMOE_ACCURACY_FAST  # noqa: E402
from ort_qmoe import session_options  # noqa: E402

SHAPES = [  # name, N, K
    ("qwen3_fc1", 1536, 2048),
    ("qwen3_fc2", 2048, 768),
    ("gptoss", 2880, 2880),
]
BLOCK = 32

# --- libqmoe (python/libqmoe.py) ----------------------------------------------------------------


def import_matrix(qmoe, weights, scale_mode):
    """A libqmoe Matrix over canonical codes imported from ORT's B, and its scale plane."""
    n, k = weights.n, weights.k
    if scale_mode == "f16":  # [K/32, N] FP16, as the qwen3_fc1_kn_scales rows
        return qmoe.import_onnx_matrix(weights.b, n, k, BLOCK,
                                       np.ascontiguousarray(weights.scales_f16.T),
                                       libqmoe.QMOE_DTYPE_F16, 1, n)
    # ORT's own float32 [N, K/32] plane, read in place
    return qmoe.import_onnx_matrix(weights.b, n, k, BLOCK, weights.scales_f32,
                                   libqmoe.QMOE_DTYPE_F32, k // BLOCK, 1)


# --- Weights -----------------------------------------------------------------------------------


class Weights:
    """One N x K matrix: ORT's B [N, K/32, 16] and scales, FP16-representable."""

    def __init__(self, n, k, rng):
        self.n, self.k = n, k
        blocks = k // BLOCK
        self.b = rng.integers(0, 256, size=(n, blocks, BLOCK // 2), dtype=np.uint8)
        magnitude = np.exp2(rng.uniform(-8.0, -5.0, size=(n, blocks)))
        sign = np.where(rng.integers(0, 2, size=(n, blocks)) == 1, -1.0, 1.0)
        self.scales_f16 = (sign * magnitude).astype(np.float16)
        self.scales_f32 = self.scales_f16.astype(np.float32)

    def dense(self):
        """W[N, K] in float64 (zero point 8)."""
        low = (self.b & 0x0F).astype(np.int16)
        high = (self.b >> 4).astype(np.int16)
        codes = np.stack([low, high], axis=-1).reshape(self.n, self.k)  # even k low nibble
        scales = np.repeat(self.scales_f32.astype(np.float64), BLOCK, axis=1)
        return (codes - 8).astype(np.float64) * scales


def reference(weights, x):
    """FP64 product, sum |x w| per output, and the fast level's bound (docs/formats.md)."""
    w = weights.dense()
    xd = x.astype(np.float64)
    y = xd @ w.T
    abs_sum = np.abs(xd) @ np.abs(w).T
    m, k = x.shape
    chunks = k // 32
    s = np.abs(xd).reshape(m, chunks, 32).max(axis=2) / 127.0
    w_chunk = np.abs(w).reshape(w.shape[0], chunks, 32).sum(axis=2)
    quant = (s / 2.0) @ w_chunk.T
    fast_bound = quant + 1e-5 * (abs_sum + quant)
    return y, abs_sum, fast_bound


# --- ONNX Runtime ------------------------------------------------------------------------------


def matmulnbits_model(weight_sets, accuracy_level, scales_2d):
    n, k = weight_sets[0].n, weight_sets[0].k
    a = helper.make_tensor_value_info("A", TensorProto.FLOAT, ["M", k])
    nodes, inits, outputs = [], [], []
    for i, w in enumerate(weight_sets):
        scales = w.scales_f32 if scales_2d else w.scales_f32.reshape(-1)
        inits.append(numpy_helper.from_array(w.b, f"B{i}"))
        inits.append(numpy_helper.from_array(scales, f"S{i}"))
        nodes.append(helper.make_node(
            "MatMulNBits", ["A", f"B{i}", f"S{i}"], [f"Y{i}"], domain="com.microsoft",
            K=k, N=n, bits=4, block_size=BLOCK, accuracy_level=accuracy_level))
        outputs.append(helper.make_tensor_value_info(f"Y{i}", TensorProto.FLOAT, ["M", n]))
    graph = helper.make_graph(nodes, "matmulnbits", [a], outputs, inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21),
                                                    helper.make_opsetid("com.microsoft", 1)])
    model.ir_version = 10  # onnxruntime 1.30 accepts IR <= 10
    return model.SerializeToString()


class OrtRunner:
    """An InferenceSession with A and every output bound once (no per-run allocation)."""

    def __init__(self, model_bytes, threads, outputs, n):
        self.session = ort.InferenceSession(model_bytes, session_options(threads),
                                            providers=["CPUExecutionProvider"])
        self.outputs = outputs
        self.n = n
        self.binding = None

    def bind(self, x):
        m = x.shape[0]
        self.x = x
        self.ys = [np.zeros((m, self.n), dtype=np.float32) for _ in range(self.outputs)]
        binding = self.session.io_binding()
        binding.bind_ortvalue_input("A", ort.OrtValue.ortvalue_from_numpy(x))
        for i, y in enumerate(self.ys):
            binding.bind_ortvalue_output(f"Y{i}", ort.OrtValue.ortvalue_from_numpy(y))
        self.binding = binding

    def run(self):
        self.session.run_with_iobinding(self.binding)


def ort_run_overhead(threads, seconds):
    """Median time of one run of a trivial model (Abs of one float): ORT's fixed cost."""
    x = helper.make_tensor_value_info("X", TensorProto.FLOAT, [1])
    y = helper.make_tensor_value_info("Y0", TensorProto.FLOAT, [1])
    graph = helper.make_graph([helper.make_node("Abs", ["X"], ["Y0"])], "abs", [x], [y])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)])
    model.ir_version = 10
    session = ort.InferenceSession(model.SerializeToString(), session_options(threads),
                                   providers=["CPUExecutionProvider"])
    xv = np.ones(1, dtype=np.float32)
    yv = np.zeros(1, dtype=np.float32)
    binding = session.io_binding()
    binding.bind_ortvalue_input("X", ort.OrtValue.ortvalue_from_numpy(xv))
    binding.bind_ortvalue_output("Y0", ort.OrtValue.ortvalue_from_numpy(yv))
    return median_time(lambda: session.run_with_iobinding(binding), seconds, 200)


def qmoe_call_overhead(qmoe, threads, seconds):
    """Median time of qmoe_gemm on an 8 x 32 matrix, M = 1: the ctypes call and the checks."""
    matrix = import_matrix(qmoe, Weights(8, 32, np.random.default_rng(1)), "f16")
    x = np.ones((1, 32), dtype=np.float32)
    y = np.zeros((1, 8), dtype=np.float32)
    with qmoe.context(threads) as ctx:
        call_args = (ctx.handle, matrix.ref, QMOE_ACCURACY_FAST, 1, x.ctypes.data, 32,
                     y.ctypes.data, 8, 0, 8)
        gemm = qmoe.lib.qmoe_gemm
        return median_time(lambda: gemm(*call_args), seconds, 200)


# --- Checks ------------------------------------------------------------------------------------


def error_ratio(got, want, tolerance):
    """Largest |got - want| / tolerance over the outputs (<= 1: within the bound)."""
    error = np.abs(got.astype(np.float64) - want.astype(np.float64))
    return float((error / np.maximum(tolerance, 1e-30)).max())


def check(name, got, want, tolerance):
    ratio = error_ratio(got, want, tolerance)
    assert ratio <= 1.0, f"{name}: worst error is {ratio:.3g} x the bound"
    return ratio


# --- Main --------------------------------------------------------------------------------------


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("libqmoe", help="path to libqmoe.so, e.g. build/lib/libqmoe.so")
    parser.add_argument("--shapes", default=",".join(s[0] for s in SHAPES),
                        help="comma-separated subset of " + ", ".join(s[0] for s in SHAPES))
    parser.add_argument("--m", default="1,4", help="activation rows, comma-separated")
    parser.add_argument("--threads", default="1,all", help="'1', 'all' or '1,all'")
    parser.add_argument("--seconds", type=float, default=0.3,
                        help="minimum timing per warm measurement and round (default 0.3)")
    parser.add_argument("--cold-runs", type=int, default=9,
                        help="runs of the R-matrix rotation per cold measurement and round")
    add_method_arguments(parser)
    parser.add_argument("--no-cold", action="store_true", help="warm weights only")
    parser.add_argument("--qmoe-scales", choices=("f16", "f32"), default="f16",
                        help="libqmoe's scale plane: FP16 [K/32, N] (default) or ORT's own "
                             "float32 [N, K/32] read in place")
    parser.add_argument("--quick", action="store_true",
                        help="short timings (0.1 s, 3 cold runs, 1 round): a smoke test")
    args = parser.parse_args()
    if args.quick:
        args.seconds, args.cold_runs, args.rounds = 0.1, 3, 1

    qmoe = libqmoe.Library(args.libqmoe)
    gate = Gate(args.gate)
    all_threads = hardware_threads()
    thread_counts = []
    for t in args.threads.split(","):
        count = all_threads if t == "all" else int(t)
        if count not in thread_counts:
            thread_counts.append(count)
    ms = [int(v) for v in args.m.split(",")]
    shapes = [s for s in SHAPES if s[0] in args.shapes.split(",")]
    cold_target = 4 * l3_bytes()

    print(f"onnxruntime {ort.__version__} (onnx {onnx.__version__}), libqmoe {qmoe.version()} "
          f"({args.libqmoe}), numpy {np.__version__}")
    print(f"{all_threads} hardware threads; L3 {l3_bytes() >> 20} MiB, cold sets >= "
          f"{cold_target >> 20} MiB; qmoe scales {args.qmoe_scales}; warm: median of per-call "
          f"times over >= {args.seconds} s x {args.rounds} rounds; cold: median of "
          f"{args.cold_runs} x {args.rounds} rotation runs / R")
    for t in thread_counts:
        ort_cost = gate.measure(lambda: ort_run_overhead(t, args.seconds))
        qmoe_cost = gate.measure(lambda: qmoe_call_overhead(qmoe, t, args.seconds))
        print(f"fixed cost per call from Python, {t} thread(s): ORT run_with_iobinding of a "
              f"trivial model {ort_cost * 1e6:.1f} us, qmoe_gemm 8 x 32 through ctypes "
              f"{qmoe_cost * 1e6:.1f} us")

    # Whether this ORT takes 2-D scales [N, K/32] (newer spec) or only the flat form.
    probe = Weights(8, 32, np.random.default_rng(0))
    try:
        ort.InferenceSession(matmulnbits_model([probe], 0, True), session_options(1),
                             providers=["CPUExecutionProvider"])
        scales_2d = True
    except Exception:  # noqa: BLE001 (any load failure: fall back to the flat form)
        scales_2d = False
    levels = []
    for level in (0, 4):
        try:
            OrtRunner(matmulnbits_model([probe], level, scales_2d), 1, 1, 8)
            levels.append(level)
        except Exception as error:  # noqa: BLE001
            print(f"accuracy_level {level} not supported by this onnxruntime: {error}")

    rows = []
    for shape_name, n, k in shapes:
        rng = np.random.default_rng(zlib.crc32(shape_name.encode()))
        warm_w = Weights(n, k, rng)
        qmoe_warm = import_matrix(qmoe, warm_w, args.qmoe_scales)
        bytes_qmoe = qmoe_warm.nbytes
        xs = {m: rng.uniform(-1.0, 1.0, size=(m, k)).astype(np.float32) for m in ms}
        refs = {m: reference(warm_w, xs[m]) for m in ms}

        # Correctness (warm weights): libqmoe against FP64 with its documented bounds and
        # against ORT (asserted); ORT against FP64 is printed as a ratio of the same bounds.
        ctx = qmoe.context(1)
        check_runners = {level: OrtRunner(matmulnbits_model([warm_w], level, scales_2d), 1, 1, n)
                         for level in levels}
        for m in ms:
            y_ref, abs_sum, fast_bound = refs[m]
            y = {}
            for acc, acc_name in ((QMOE_ACCURACY_EXACT, "exact"), (QMOE_ACCURACY_FAST, "fast")):
                y[acc_name] = qmoe.gemm(ctx, qmoe_warm, acc, xs[m])
            for level, runner in check_runners.items():
                runner.bind(xs[m])
                runner.run()
                y[f"ort{level}"] = runner.ys[0].copy()
            notes = [
                "qmoe exact %.2f" % check(f"{shape_name} m={m} qmoe exact vs fp64", y["exact"],
                                          y_ref, 1e-5 * abs_sum),
                "qmoe fast %.2f" % check(f"{shape_name} m={m} qmoe fast vs fp64", y["fast"],
                                         y_ref, fast_bound)]
            if 0 in levels:
                notes.append("ORT lvl0 %.2f" % error_ratio(y["ort0"], y_ref, 1e-5 * abs_sum))
                check(f"{shape_name} m={m} qmoe exact vs ORT level 0", y["exact"], y["ort0"],
                      2e-5 * abs_sum)
            if 4 in levels:
                notes.append("ORT lvl4 %.2f" % error_ratio(y["ort4"], y_ref, fast_bound))
                check(f"{shape_name} m={m} qmoe fast vs ORT level 4", y["fast"], y["ort4"],
                      2 * fast_bound)
            print(f"  {shape_name} m={m}: worst error / bound vs FP64 (exact: 1e-5 sum|xw|, "
                  f"fast: docs/formats.md): " + ", ".join(notes) +
                  "; qmoe vs ORT within 2x the bounds")
        del check_runners
        ctx.close()
        print(f"{shape_name} (N={n} K={k}): checks passed on {ctx.isa}")

        # Warm timing.
        for t in thread_counts:
            ctx = qmoe.context(t)
            runners = {level: OrtRunner(matmulnbits_model([warm_w], level, scales_2d), t, 1, n)
                       for level in levels}
            samples = {}
            for _ in range(args.rounds):
                for m in ms:
                    x = xs[m]
                    y = np.zeros((m, n), dtype=np.float32)
                    for level in levels:
                        runners[level].bind(x)
                        samples.setdefault((m, f"ort{level}"), []).append(gate.measure(
                            lambda: median_time(runners[level].run, args.seconds, 20)))
                    time.sleep(0.02)  # let ORT's spinning workers park
                    for acc, acc_name in ((QMOE_ACCURACY_EXACT, "exact"),
                                          (QMOE_ACCURACY_FAST, "fast")):
                        call_args = (ctx.handle, qmoe_warm.ref, acc, m, x.ctypes.data, k,
                                     y.ctypes.data, n, 0, n)
                        gemm = qmoe.lib.qmoe_gemm
                        samples.setdefault((m, acc_name), []).append(gate.measure(
                            lambda: median_time(lambda: gemm(*call_args), args.seconds, 20)))
                    time.sleep(0.05)  # and libqmoe's pool workers
            for m in ms:
                rows.append((shape_name, m, t, "warm",
                             {key: statistics.median(v) for (mm, key), v in samples.items()
                              if mm == m}))
            del runners
            ctx.close()
            time.sleep(0.05)

        if args.no_cold:
            continue
        # Cold timing: R distinct weight sets, the same bytes for both.
        count = max(2, math.ceil(cold_target / bytes_qmoe))
        cold_w = [Weights(n, k, rng) for _ in range(count)]
        qmoe_cold = [import_matrix(qmoe, w, args.qmoe_scales) for w in cold_w]
        model_bytes = {level: matmulnbits_model(cold_w, level, scales_2d) for level in levels}
        print(f"{shape_name}: cold rotation of R = {count} matrices, "
              f"{count * bytes_qmoe / 2**20:.0f} MiB in libqmoe's form")
        for t in thread_counts:
            ctx = qmoe.context(t)
            samples = {}
            runners = {}
            for level in levels:
                runners[level] = OrtRunner(model_bytes[level], t, count, n)
            for _ in range(args.rounds):
                for m in ms:
                    x = xs[m]
                    y = np.zeros((m, n), dtype=np.float32)
                    for level in levels:
                        runners[level].bind(x)
                        samples.setdefault((m, f"ort{level}"), []).append(gate.measure(
                            lambda: median_time(runners[level].run, 0.0, args.cold_runs, count)))
                    time.sleep(0.02)
                    for acc, acc_name in ((QMOE_ACCURACY_EXACT, "exact"),
                                          (QMOE_ACCURACY_FAST, "fast")):
                        all_args = [(ctx.handle, q.ref, acc, m, x.ctypes.data, k,
                                     y.ctypes.data, n, 0, n) for q in qmoe_cold]
                        gemm = qmoe.lib.qmoe_gemm

                        def rotation():
                            for a in all_args:
                                gemm(*a)
                        samples.setdefault((m, acc_name), []).append(gate.measure(
                            lambda: median_time(rotation, 0.0, args.cold_runs, count)))
                    time.sleep(0.05)
            for m in ms:
                rows.append((shape_name, m, t, "cold",
                             {key: statistics.median(v) for (mm, key), v in samples.items()
                              if mm == m}))
            del runners
            ctx.close()
            time.sleep(0.05)
        del cold_w, qmoe_cold, model_bytes

    # Table.
    print()
    if gate.enabled:
        print(f"--gate: {gate.repeated} measurements repeated after interference, "
              f"{gate.disturbed} kept although still disturbed")
    print("Times in us per product (median). ratio = ORT / qmoe: > 1 means libqmoe is faster.")
    print("exact pairs with ORT accuracy_level 0, fast with accuracy_level 4.")
    header = (f"{'shape':<10} {'M':>2} {'thr':>3} {'weights':<5} "
              f"{'ORT lvl0':>9} {'qmoe exact':>10} {'ratio':>6}   "
              f"{'ORT lvl4':>9} {'qmoe fast':>9} {'ratio':>6}")
    print(header)
    print("-" * len(header))
    for shape_name, m, t, kind, times in rows:
        def cell(key):
            return f"{times[key] * 1e6:9.1f}" if key in times else f"{'-':>9}"

        def ratio(ort_key, qmoe_key):
            if ort_key in times and qmoe_key in times:
                return f"{times[ort_key] / times[qmoe_key]:6.2f}"
            return f"{'-':>6}"
        print(f"{shape_name:<10} {m:>2} {t:>3} {kind:<5} {cell('ort0')} "
              f"{cell('exact'):>10} {ratio('ort0', 'exact')}   {cell('ort4')} "
              f"{cell('fast'):>9} {ratio('ort4', 'fast')}")


if __name__ == "__main__":
    main()
