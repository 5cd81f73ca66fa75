#!/usr/bin/env python3
"""libqmoe against ONNX Runtime on the same weights, in the same process: `gemm`, the INT4
dequant-GEMM against com.microsoft.MatMulNBits, and `moe`, the MoE layer against
com.microsoft.QMoE's CPU kernel.

Usage:
  pip install onnxruntime onnx numpy
  python3 benchmarks/compare_onnxruntime.py gemm build/lib/libqmoe.so [--quick] [--no-cold] ...
  python3 benchmarks/compare_onnxruntime.py moe build/lib/libqmoe.so [--quick] [--gate] ...

Both subcommands give the same bytes to both sides, check the outputs first (assert), then time
both sides the same way and print a table of times and the ratios ORT time / qmoe time (> 1:
libqmoe is faster). Pairing: qmoe exact with ORT accuracy_level 0 (FP32 activations), qmoe fast
with ORT accuracy_level 4 (int8 activations per block of 32 k on both sides at block 32).
Timing: for each thread count, --rounds interleaved rounds; in each, for each M, ORT level 0,
ORT level 4, qmoe exact, qmoe fast; the samples of all rounds pooled, the median reported
(python/benchutil.py). --gate, on a shared Linux host, repeats measurements that other
processes disturbed.

gemm: for each expert shape (Qwen3-30B-A3B FC1 and FC2, a gpt-oss-20b-like 2880 x 2880), M = 1
and 4, and 1 and all hardware threads:
  * builds one-node ONNX models with MatMulNBits (bits=4, block_size=32, no zero points, float
    scales) for accuracy_level 0 and 4, with random uint8 B [N, K/32, 16] (code k of a row: byte
    k/2, low nibble for even k) and FP16-representable scales [N, K/32];
  * imports the SAME bytes into libqmoe's canonical layout (qmoe_import_int4_onnx through
    ctypes, python/libqmoe.py) with the same scales as FP16 in [K/32, N] order (the order of
    the qwen3_fc1_kn_scales rows of qmoe_bench; --qmoe-scales f32 passes the float32 [N, K/32]
    plane ORT reads instead), and runs qmoe_gemm at the exact and fast levels;
  * warm = one matrix called again and again, median of per-call times; cold = a rotation
    through R distinct weight sets, R x bytes >= 4 x L3, so that every call reads its weights
    from DRAM (ORT: one model with R MatMulNBits nodes sharing input A, one run = R products;
    libqmoe: R qmoe_gemm calls in a Python loop; median of runs / R);
  * checks each side against an FP64 reference with libqmoe's documented bounds (exact:
    1e-5 * sum|x w|; fast: the activation-quantization bound of docs/formats.md), and qmoe
    exact vs ORT level 0, qmoe fast vs ORT level 4.
  A warm ORT call pays the Python binding of run_with_iobinding (inputs and outputs pre-bound),
  a qmoe call one ctypes call; both fixed costs are measured (ORT: a trivial one-node model;
  libqmoe: an 8 x 32 product) and printed. In the cold rows ORT's per-run cost is spread over R
  nodes.

moe: the layer is Qwen3-30B-A3B's: E = 128 experts, top-8, H = 2048, I = 768, INT4 block 32 (no
zero points: 8), FP16-representable FP32 scales, swiglu_fusion = 1 (gate/up interleaved rows),
SiLU (alpha 1, beta 0, no limit). For M = 1 and 4 tokens and every thread count from 1 to the
number of hardware threads, it
  * builds R independent random layers (python/ort_qmoe.py QMoELayer), R >= 2 and R x layer
    bytes >= 4 x L3: ORT gets one model of R QMoE nodes sharing inputs X and router logits (one
    run = R layers), libqmoe R expert sets (codes through qmoe_import_int4_onnx into huge-page
    weight memory, the same scales as FP16 planes in the grouped order, the form `qmoe run`
    uses; --qmoe-scales f16 gives FP16 [K/32, N] planes, f32 reads ORT's own FP32 [N, K/32]
    planes in place) run with qmoe_moe_forward_logits (k = 8, renormalize = 1), R calls in a
    Python loop;
  * keeps the weights cold: before every timed run (outside the timing) fresh router logits
    are written into the buffer both sides read, the same sequence for each side, so each run
    routes to new experts of R layers whose weights together are several times the L3;
  * reports the median of runs divided by R x M: microseconds per token and layer;
  * checks, on layer 0 for every M (as tests/python/onnxruntime_qmoe_test.py does with
    python/qmoe_parity.py), each output against an FP64 reference within the bounds of
    docs/abi.md, and libqmoe exact against ORT level 0, libqmoe fast against ORT level 4.
  --activations f16 runs the layer on FP16 activations: ORT's QMoE with T = float16 (X, router
  logits, scales and Y in FP16), libqmoe's qmoe_moe_forward_logits_typed on the same FP16
  buffers; the checks add the rounding of Y to FP16 to every bound.
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
import ort_qmoe  # noqa: E402
import qmoe_parity  # noqa: E402
from benchutil import (Gate, add_method_arguments, hardware_threads, l3_bytes,  # noqa: E402
                       median_time)
from libqmoe import QMOE_ACCURACY_EXACT, QMOE_ACCURACY_FAST  # noqa: E402

BLOCK = 32
PAIRS = ((0, "exact"), (4, "fast"))  # ORT accuracy_level, the libqmoe level it pairs with

# --- Shared: thread counts, interleaved rounds, the table --------------------------------------


def thread_counts(text, every):
    """Comma-separated counts in order, each once; 'all' stands for the counts in `every`."""
    counts = []
    for token in text.split(","):
        for count in (every if token == "all" else [int(token)]):
            if count not in counts:
                counts.append(count)
    return counts


def for_each_thread_count(qmoe, counts, body):
    """Rows of body(t, ctx) for each count t, on a fresh libqmoe context of t threads; what the
    body built (ORT sessions) is freed before the next count's."""
    rows = []
    for t in counts:
        with qmoe.context(t) as ctx:
            rows += body(t, ctx)
        time.sleep(0.05)
    return rows


def measure_rounds(gate, rounds, ms, levels, ort_measurement, qmoe_measurement):
    """{M: {"ort0", "ort4", "exact", "fast": median seconds}} over `rounds` interleaved rounds.
    ort_measurement(level, m) and qmoe_measurement(accuracy, m) prepare one measurement (bind
    the inputs, convert the call's arguments) and return the function that times it."""
    samples = {}
    for _ in range(rounds):
        for m in ms:
            for level in levels:
                measurement = ort_measurement(level, m)
                samples.setdefault((m, f"ort{level}"), []).append(gate.measure(measurement))
            time.sleep(0.02)  # let ORT's spinning workers park
            for accuracy, name in libqmoe.ACCURACY_NAMES.items():
                measurement = qmoe_measurement(accuracy, m)
                samples.setdefault((m, name), []).append(gate.measure(measurement))
            time.sleep(0.05)  # and libqmoe's pool workers
    return {m: {key: statistics.median(v) for (mm, key), v in samples.items() if mm == m}
            for m in ms}


def print_versions(qmoe, path):
    print(f"onnxruntime {ort.__version__} (onnx {onnx.__version__}), libqmoe {qmoe.version()} "
          f"({path}), numpy {np.__version__}")


def print_table(gate, unit, columns, rows):
    """rows: (keys, times) with one key per (title, format) column; a pair with a time
    missing (an accuracy level this onnxruntime lacks) prints '-'."""
    print()
    if gate.enabled:
        print(f"--gate: {gate.repeated} measurements repeated after interference, "
              f"{gate.disturbed} kept although still disturbed")
    print(f"Times in {unit}. ratio = ORT / qmoe: > 1 means libqmoe is faster.")
    print("exact pairs with ORT accuracy_level 0, fast with accuracy_level 4.")
    header = " ".join(f"{title:{spec}}" for title, spec in columns) + "".join(
        f"   {f'ORT lvl{level}':>10} {f'qmoe {name}':>10} {'ratio':>6}" for level, name in PAIRS)
    print(header)
    print("-" * len(header))
    for keys, times in rows:
        line = " ".join(f"{key:{spec}}" for key, (_, spec) in zip(keys, columns))
        for level, name in PAIRS:
            ort_time, qmoe_time = times.get(f"ort{level}"), times.get(name)
            cells = [f"{s * 1e6:10.1f}" if s is not None else f"{'-':>10}"
                     for s in (ort_time, qmoe_time)]
            ratio = (f"{ort_time / qmoe_time:6.2f}" if ort_time is not None
                     and qmoe_time is not None else f"{'-':>6}")
            line += "   " + " ".join(cells + [ratio])
        print(line)


def check(name, got, want, tolerance):
    """Asserts |got - want| <= tolerance everywhere; returns the worst error / tolerance."""
    ratio = error_ratio(got, want, tolerance)
    assert ratio <= 1.0, f"{name}: worst error is {ratio:.3g} x the bound"
    return ratio


def error_ratio(got, want, tolerance):
    """Largest |got - want| / tolerance over the outputs (<= 1: within the bound)."""
    error = np.abs(got.astype(np.float64) - want.astype(np.float64))
    return float((error / np.maximum(tolerance, 1e-30)).max())


# --- gemm: qmoe_gemm against MatMulNBits -------------------------------------------------------

SHAPES = [  # name, N, K
    ("qwen3_fc1", 1536, 2048),
    ("qwen3_fc2", 2048, 768),
    ("gptoss", 2880, 2880),
]


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
        self.session = ort.InferenceSession(model_bytes, ort_qmoe.session_options(threads),
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
    session = ort.InferenceSession(model.SerializeToString(), ort_qmoe.session_options(threads),
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


def supported_levels():
    """Whether this ORT takes 2-D scales [N, K/32] (newer spec) or only the flat form, and the
    accuracy levels of PAIRS it supports."""
    probe = Weights(8, 32, np.random.default_rng(0))
    try:
        ort.InferenceSession(matmulnbits_model([probe], 0, True), ort_qmoe.session_options(1),
                             providers=["CPUExecutionProvider"])
        scales_2d = True
    except Exception:  # noqa: BLE001 (any load failure: fall back to the flat form)
        scales_2d = False
    levels = []
    for level, _ in PAIRS:
        try:
            OrtRunner(matmulnbits_model([probe], level, scales_2d), 1, 1, 8)
            levels.append(level)
        except Exception as error:  # noqa: BLE001
            print(f"accuracy_level {level} not supported by this onnxruntime: {error}")
    return scales_2d, levels


def check_gemm(qmoe, shape_name, weights, matrix, xs, levels, scales_2d):
    """libqmoe against FP64 with its documented bounds and against ORT (asserted); ORT
    against FP64 is printed as a ratio of the same bounds."""
    n = weights.n
    with qmoe.context(1) as ctx:
        runners = {level: OrtRunner(matmulnbits_model([weights], level, scales_2d), 1, 1, n)
                   for level in levels}
        for m, x in xs.items():
            y_ref, abs_sum, fast_bound = reference(weights, x)
            y = {name: qmoe.gemm(ctx, matrix, accuracy, x)
                 for accuracy, name in libqmoe.ACCURACY_NAMES.items()}
            for level, runner in runners.items():
                runner.bind(x)
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
        print(f"{shape_name} (N={n} K={weights.k}): checks passed on {ctx.isa}")


def time_gemm(args, qmoe, gate, counts, levels, shape, kind, model, matrices, xs):
    """Rows of one shape, (name, N, K), at every thread count: `matrices` called in turn (one
    for warm, R for cold), ORT running `model` (one node per matrix); times per product."""
    shape_name, n, k = shape
    ys = {m: np.zeros((m, n), dtype=np.float32) for m in xs}  # outputs, alive for every call
    per_run = len(matrices)
    seconds, runs = (args.seconds, 20) if kind == "warm" else (0.0, args.cold_runs)

    def body(t, ctx):
        runners = {level: OrtRunner(model[level], t, per_run, n) for level in levels}

        def ort_measurement(level, m):
            runners[level].bind(xs[m])
            return lambda: median_time(runners[level].run, seconds, runs, per_run)

        def qmoe_measurement(accuracy, m):
            all_args = [(ctx.handle, q.ref, accuracy, m, xs[m].ctypes.data, k,
                         ys[m].ctypes.data, n, 0, n) for q in matrices]
            gemm = qmoe.lib.qmoe_gemm
            if per_run == 1:
                return lambda: median_time(lambda: gemm(*all_args[0]), seconds, runs)

            def rotation():
                for a in all_args:
                    gemm(*a)
            return lambda: median_time(rotation, seconds, runs, per_run)

        medians = measure_rounds(gate, args.rounds, list(xs), levels, ort_measurement,
                                 qmoe_measurement)
        return [((shape_name, m, t, kind), medians[m]) for m in xs]
    return for_each_thread_count(qmoe, counts, body)


def run_gemm(args, qmoe, gate):
    all_threads = hardware_threads()
    counts = thread_counts(args.threads, [all_threads])
    ms = [int(v) for v in args.m.split(",")]
    shapes = [s for s in SHAPES if s[0] in args.shapes.split(",")]
    cold_target = 4 * l3_bytes()

    print_versions(qmoe, args.libqmoe)
    print(f"{all_threads} hardware threads; L3 {l3_bytes() >> 20} MiB, cold sets >= "
          f"{cold_target >> 20} MiB; qmoe scales {args.qmoe_scales}; warm: median of per-call "
          f"times over >= {args.seconds} s x {args.rounds} rounds; cold: median of "
          f"{args.cold_runs} x {args.rounds} rotation runs / R")
    for t in counts:
        ort_cost = gate.measure(lambda: ort_run_overhead(t, args.seconds))
        qmoe_cost = gate.measure(lambda: qmoe_call_overhead(qmoe, t, args.seconds))
        print(f"fixed cost per call from Python, {t} thread(s): ORT run_with_iobinding of a "
              f"trivial model {ort_cost * 1e6:.1f} us, qmoe_gemm 8 x 32 through ctypes "
              f"{qmoe_cost * 1e6:.1f} us")
    scales_2d, levels = supported_levels()

    rows = []
    for shape in shapes:
        shape_name, n, k = shape
        rng = np.random.default_rng(zlib.crc32(shape_name.encode()))
        warm_w = Weights(n, k, rng)
        qmoe_warm = import_matrix(qmoe, warm_w, args.qmoe_scales)
        xs = {m: rng.uniform(-1.0, 1.0, size=(m, k)).astype(np.float32) for m in ms}
        check_gemm(qmoe, shape_name, warm_w, qmoe_warm, xs, levels, scales_2d)
        model = {level: matmulnbits_model([warm_w], level, scales_2d) for level in levels}
        rows += time_gemm(args, qmoe, gate, counts, levels, shape, "warm", model, [qmoe_warm], xs)
        if args.no_cold:
            continue
        # Cold: R distinct weight sets, the same bytes for both.
        count = max(2, math.ceil(cold_target / qmoe_warm.nbytes))
        cold_w = [Weights(n, k, rng) for _ in range(count)]
        qmoe_cold = [import_matrix(qmoe, w, args.qmoe_scales) for w in cold_w]
        model = {level: matmulnbits_model(cold_w, level, scales_2d) for level in levels}
        print(f"{shape_name}: cold rotation of R = {count} matrices, "
              f"{count * qmoe_warm.nbytes / 2**20:.0f} MiB in libqmoe's form")
        rows += time_gemm(args, qmoe, gate, counts, levels, shape, "cold", model, qmoe_cold, xs)
        del cold_w, qmoe_cold, model

    print_table(gate, "us per product (median)",
                (("shape", "<10"), ("M", ">2"), ("thr", ">3"), ("weights", "<7")), rows)


# --- moe: qmoe_moe_forward_logits against QMoE -------------------------------------------------

EXPERTS, TOP_K, HIDDEN, INTER = 128, 8, 2048, 768
SWIGLU = ort_qmoe.QWEN3_SWIGLU


def fresh_logits(logits, seed):
    """A prepare() that writes the next router logits of a fixed random sequence into
    `logits` in place (the same sequence for every side measured with the same seed)."""
    stream = np.random.default_rng(seed)

    def prepare():
        logits[...] = 2.0 * stream.standard_normal(logits.shape)
    return prepare


def check_moe(qmoe, ctx, threads, first, expert_set, runners, xs, check_logits, fp16):
    """Both sides on layer 0 against FP64 and each other (asserted), with this thread count
    (libqmoe's result does not depend on it; ORT's combine order does, within the bound)."""
    for m, x in xs.items():
        lg = check_logits[m]
        outputs = {
            qmoe_parity.QMOE_EXACT: qmoe.moe_forward_logits(
                ctx, expert_set, libqmoe.QMOE_ACCURACY_EXACT, x, lg, TOP_K),
            qmoe_parity.QMOE_FAST: qmoe.moe_forward_logits(
                ctx, expert_set, libqmoe.QMOE_ACCURACY_FAST, x, lg, TOP_K),
        }
        for level, name in ((0, qmoe_parity.ORT_LEVEL0), (4, qmoe_parity.ORT_LEVEL4)):
            if level in runners:
                outputs[name] = runners[level].forward(x, lg)[0]
        results, _ = qmoe_parity.check_outputs(
            first, SWIGLU, x.astype(np.float32), lg.astype(np.float32), TOP_K, outputs,
            fp16=fp16)
        print(f"  check M={m}: worst error / bound: " +
              ", ".join(f"{name} {ratio:.2g}" for name, ratio in results))
        bad = [f"{name}: {ratio:.3g} x the bound" for name, ratio in results
               if not ratio <= 1.0]
        assert not bad, f"M={m}: outputs disagree: " + "; ".join(bad)
    print(f"checks passed ({ctx.isa}, {threads} thread(s))")


def run_moe(args, qmoe, gate):
    counts = thread_counts(args.threads, list(range(1, hardware_threads() + 1)))
    ms = [int(v) for v in args.m.split(",")]

    rng = np.random.default_rng(30)
    first = ort_qmoe.QMoELayer(EXPERTS, HIDDEN, INTER, BLOCK, rng)
    count = args.layers or max(2, math.ceil(4 * l3_bytes() / first.nbytes))
    layers = [first] + [ort_qmoe.QMoELayer(EXPERTS, HIDDEN, INTER, BLOCK, rng)
                        for _ in range(count - 1)]
    fp16_scales = {"grouped": "grouped", "f16": True, "f32": False}[args.qmoe_scales]
    sets = [layer.expert_set(qmoe, SWIGLU, fp16_scales=fp16_scales) for layer in layers]
    ort_expert, qmoe_expert = first.nbytes / EXPERTS, sets[0].nbytes / EXPERTS
    print_versions(qmoe, args.libqmoe)
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
    levels = ort_qmoe.accuracy_levels()
    if len(levels) < len(PAIRS):
        print(f"onnxruntime {ort.__version__}'s QMoE has no accuracy_level: its level 4 "
              "column is left empty")
    models = {level: ort_qmoe.qmoe_model(layers, TOP_K, SWIGLU, level, dtype)
              for level in levels}

    def body(t, ctx):
        runners = {level: ort_qmoe.QMoERunner(models[level], t, count, HIDDEN)
                   for level in levels}
        if t == counts[0]:
            check_moe(qmoe, ctx, t, first, sets[0], runners, xs, check_logits, fp16)

        def ort_measurement(level, m):
            runners[level].bind(xs[m], logits[m])
            return lambda: median_time(runners[level].run, 0.0, args.runs, count * m,
                                       fresh_logits(logits[m], m))

        def qmoe_measurement(accuracy, m):
            calls = [qmoe.forward_logits_call(ctx, s, accuracy, xs[m], logits[m], TOP_K,
                                              np.zeros_like(xs[m])) for s in sets]

            def rotation():
                for call in calls:
                    call()
            return lambda: median_time(rotation, 0.0, args.runs, count * m,
                                       fresh_logits(logits[m], m))

        medians = measure_rounds(gate, args.rounds, ms, list(levels),
                                 ort_measurement, qmoe_measurement)
        return [((m, t), medians[m]) for m in ms]

    rows = for_each_thread_count(qmoe, counts, body)
    print_table(gate, "us per token and layer (median; cold weights)",
                (("M", ">2"), ("thr", ">3")), rows)
    for s in sets:
        s.close()


# --- Command line ------------------------------------------------------------------------------


def main():
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("libqmoe", help="path to libqmoe.so, e.g. build/lib/libqmoe.so")
    common.add_argument("--m", default="1,4", help="activation rows (tokens), comma-separated")
    add_method_arguments(common)

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)

    gemm = commands.add_parser("gemm", parents=[common],
                               help="qmoe_gemm against MatMulNBits, per expert shape")
    gemm.add_argument("--shapes", default=",".join(s[0] for s in SHAPES),
                      help="comma-separated subset of " + ", ".join(s[0] for s in SHAPES))
    gemm.add_argument("--threads", default="1,all",
                      help="comma-separated counts, 'all' = the hardware threads (default 1,all)")
    gemm.add_argument("--seconds", type=float, default=0.3,
                      help="minimum timing per warm measurement and round (default 0.3)")
    gemm.add_argument("--cold-runs", type=int, default=9,
                      help="runs of the R-matrix rotation per cold measurement and round")
    gemm.add_argument("--no-cold", action="store_true", help="warm weights only")
    gemm.add_argument("--qmoe-scales", choices=("f16", "f32"), default="f16",
                      help="libqmoe's scale plane: FP16 [K/32, N] (default) or ORT's own "
                           "float32 [N, K/32] read in place")
    gemm.add_argument("--quick", action="store_true",
                      help="short timings (0.1 s, 3 cold runs, 1 round): a smoke test")

    moe = commands.add_parser("moe", parents=[common],
                              help="qmoe_moe_forward_logits against QMoE, the Qwen3 layer")
    moe.add_argument("--threads", default="all",
                     help="comma-separated counts, 'all' = every count from 1 to the hardware "
                          "threads (default)")
    moe.add_argument("--layers", type=int, default=0,
                     help="R, the layers rotated (default: >= 2 and >= 4 x L3 of weights)")
    moe.add_argument("--runs", type=int, default=15,
                     help="timed runs (of all R layers) per measurement and round")
    moe.add_argument("--qmoe-scales", choices=("grouped", "f16", "f32"), default="grouped",
                     help="libqmoe's weights: FP16 scales in the grouped order with codes in "
                          "huge-page weight memory (default; what qmoe run uses), FP16 "
                          "[K/32, N] planes, or ORT's own FP32 [N, K/32] planes in place")
    moe.add_argument("--activations", choices=("f32", "f16"), default="f32",
                     help="type of X, the router logits and Y on both sides (default f32)")
    moe.add_argument("--quick", action="store_true",
                     help="5 runs, 1 round: a smoke test with rough figures")

    args = parser.parse_args()
    qmoe = libqmoe.Library(args.libqmoe)
    gate = Gate(args.gate)
    if args.command == "gemm":
        if args.quick:
            args.seconds, args.cold_runs, args.rounds = 0.1, 3, 1
        run_gemm(args, qmoe, gate)
    else:
        if args.quick:
            args.runs, args.rounds = 5, 1
        run_moe(args, qmoe, gate)


if __name__ == "__main__":
    main()
