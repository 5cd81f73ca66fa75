#!/usr/bin/env python3
"""Parity test: libqmoe's MoE layer against ONNX Runtime's com.microsoft.QMoE CPU operator.

Why: libqmoe's own tests check it against an FP64 model of the maths that we wrote; this test
checks it against an implementation we did not write. The same INT4 weights (random codes,
FP16-representable FP32 scales), the same activations and the same router logits go to ORT's
QMoE (one-node model, python/ort_qmoe.py) and to libqmoe (python/libqmoe.py: weights through
qmoe_import_int4_onnx with ORT's FP32 scales read in place, qmoe_moe_forward on logits with k and
renormalize = 1), for
  - block sizes 32, 64 and 128, swiglu_fusion = 1 (gate/up interleaved rows);
  - Qwen3-like SwiGLU (alpha 1, beta 0, no limit) and gpt-oss-like (alpha 1.702, beta 1,
    limit 7, with FC1 scales large enough that the limit clamps);
  - M = 1 and M = 4 tokens; E = 16 experts, k = 4, H = 512, I = 256;
  - libqmoe's weights both as ORT reads them (FP32 [N, K/block] scales in place) and as qmoe
    run lays them out (FP16 scales in the grouped order, codes in qmoe_alloc_weight_memory),
    which must give the same bits.
Every output is checked against an FP64 reference with the per-output bounds of docs/abi.md
(python/qmoe_parity.py; its docstring derives them): libqmoe exact and ORT accuracy_level 0
within the exact bound, libqmoe fast within the fast bound. ORT accuracy_level 4 quantizes
activations per block of the weights (32, 64 or 128 k) rather than per 32, with the same step
max|x| / 127 and rounding to nearest, and its int8 rows are not reproduced bit for bit: its
bound is the fast bound with that chunk, plus one step for a value within 1e-4 step of a
rounding boundary. Pairs: libqmoe exact against ORT level 0 within twice the exact bound,
libqmoe fast against ORT level 4 within the sum of their bounds plus the distance between their
FP64 references. Also: qmoe_moe_route_topk picks the reference's experts, and
qmoe_moe_forward on those routes equals qmoe_moe_forward on logits bit for bit.

FP16 activations (block 32, both SwiGLUs, M = 1 and 4): ORT's QMoE with T = float16 (X, router
logits, scales and Y in FP16; its CPU kernel has no BF16), accuracy_level 0 and 4, against
qmoe_moe_forward on 16-bit activations with QMOE_DTYPE_F16 at the exact and fast levels on the same FP16 X,
routed by qmoe_moe_route_topk on the FP16 logits widened. The same checks as above on the
widened X, every bound plus the rounding of Y to FP16 (python/qmoe_parity.py fp16_rounding);
libqmoe's FP16 Y must equal its FP32 forward on the widened X rounded to FP16, and
qmoe_moe_forward on 16-bit logits on the FP16 logits themselves, bit for bit.

Logits are drawn without ties at the top-k boundary: there ORT's CPU kernel ranks equal logits
higher id first and libqmoe lower id first (docs/abi.md), the one documented difference.

Usage: onnxruntime_qmoe_test.py path/to/libqmoe.so
onnxruntime 1.30's QMoE has no accuracy_level attribute: there the ORT level 4 checks are left out
(said in the output) and the rest run.

Exit status: 0 pass, 1 failure (each failing check printed), 77 skipped (numpy, onnx or
onnxruntime cannot be imported, or this onnxruntime's QMoE lacks an attribute the layer needs;
the reason is printed). With CI=true in the environment a missing package is a failure instead:
CI's parity check must not pass by skipping.
"""

import os
import sys

try:
    import numpy as np
    import onnx  # noqa: F401  (python/ort_qmoe.py builds the model with it)
    import onnxruntime as ort
except ImportError as error:
    in_ci = os.environ.get("CI", "").lower() == "true"
    print(f"{'FAIL' if in_ci else 'SKIP'}: onnxruntime_qmoe_test needs numpy, onnx and "
          f"onnxruntime ({error}); python3 -m pip install onnxruntime onnx numpy"
          + (" (CI=true: a skipped parity check is a failure)" if in_ci else ""))
    sys.exit(1 if in_ci else 77)

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "python"))
import libqmoe  # noqa: E402
import ort_qmoe  # noqa: E402
import qmoe_parity  # noqa: E402

EXPERTS, K, HIDDEN, INTER = 16, 4, 512, 256
BLOCKS = (32, 64, 128)
TOKENS = (1, 4)
SWIGLUS = {"qwen3": ort_qmoe.QWEN3_SWIGLU, "gpt-oss": ort_qmoe.GPT_OSS_SWIGLU}
# FC1 scale exponents: |h| of a few units for gpt-oss, so that some pass the limit of 7.
FC1_EXPONENTS = {"qwen3": (-8.0, -5.0), "gpt-oss": (-6.0, -3.0)}
# The inputs python/ort_qmoe.py passes, in the order this onnxruntime's schema must have.
EXPECTED_INPUTS = ["input", "router_probs", "fc1_experts_weights", "fc1_scales",
                   "fc1_experts_bias", "fc2_experts_weights", "fc2_scales"]


def ort_outputs(runners, x, logits):
    """{ORT level name: its output} for each accuracy level with a runner."""
    names = {0: qmoe_parity.ORT_LEVEL0, 4: qmoe_parity.ORT_LEVEL4}
    return {names[level]: runner.forward(x, logits)[0] for level, runner in runners.items()}


def check_fp16(library, context, layer, swiglu, swiglu_name, threads, rng):
    """The FP16 cases of the docstring for one layer; returns the failures."""
    failures = []
    runners = {level: ort_qmoe.QMoERunner(ort_qmoe.qmoe_model([layer], K, swiglu, level,
                                                              np.float16), threads, 1, HIDDEN)
               for level in ort_qmoe.accuracy_levels()}
    with layer.expert_set(library, swiglu) as expert_set:
        for m in TOKENS:
            case = f"block {layer.block}, {swiglu_name}, M={m}, FP16"
            x16 = rng.uniform(-1.0, 1.0, size=(m, HIDDEN)).astype(np.float16)
            logits16 = qmoe_parity.draw_logits(rng, m, EXPERTS, K, np.float16)
            x32, logits32 = x16.astype(np.float32), logits16.astype(np.float32)
            ids, weights = library.route_topk(logits32, K)
            outputs = {}
            for level, name in ((libqmoe.QMOE_ACCURACY_EXACT, qmoe_parity.QMOE_EXACT),
                                (libqmoe.QMOE_ACCURACY_FAST, qmoe_parity.QMOE_FAST)):
                outputs[name] = library.moe_forward(context, expert_set, level, x16, ids,
                                                    weights)
                fp32 = library.moe_forward(context, expert_set, level, x32, ids, weights)
                if not np.array_equal(outputs[name].view(np.uint16),
                                      fp32.astype(np.float16).view(np.uint16)):
                    failures.append(f"{case}: {name}: qmoe_moe_forward on 16-bit activations differs from the "
                                    "FP32 forward rounded to FP16")
                via_logits = library.moe_forward_logits(context, expert_set, level, x16,
                                                        logits16, K)
                if not np.array_equal(via_logits.view(np.uint16),
                                      outputs[name].view(np.uint16)):
                    failures.append(f"{case}: {name}: qmoe_moe_forward on 16-bit logits on the FP16 "
                                    "logits differs from route-then-forward")
            outputs.update(ort_outputs(runners, x16, logits16))
            results, _ = qmoe_parity.check_outputs(layer, swiglu, x32, logits32, K, outputs,
                                                   fp16=True)
            print(f"{case}: worst error / bound: " +
                  ", ".join(f"{name} {ratio:.2g}" for name, ratio in results))
            failures += [f"{case}: {name}: worst error is {ratio:.3g} x the bound"
                         for name, ratio in results if not ratio <= 1.0]
    return failures


def main():
    if len(sys.argv) != 2:
        sys.exit(__doc__.split("Usage: ")[1].split("\n")[0])
    library = libqmoe.Library(sys.argv[1])
    threads = min(4, os.cpu_count() or 1)
    print(f"onnxruntime {ort.__version__}, numpy {np.__version__}, libqmoe {library.version()} "
          f"({sys.argv[1]}); E={EXPERTS} k={K} H={HIDDEN} I={INTER}, {threads} threads")
    failures = []

    missing = ort_qmoe.missing_attributes()
    if missing:
        print(f"SKIP: onnxruntime {ort.__version__}'s QMoE lacks {missing}, without which it "
              "computes a different layer; onnxruntime >= 1.32 has them")
        return 77
    if 4 not in ort_qmoe.accuracy_levels():
        print(f"NOTE: onnxruntime {ort.__version__}'s QMoE has no accuracy_level (FP32 "
              "activations only): the ORT level 4 checks are skipped, all others run")
    schema = ort_qmoe.qmoe_schema_inputs()
    if schema is not None and schema[:len(EXPECTED_INPUTS)] != EXPECTED_INPUTS:
        failures.append(f"QMoE's inputs are {schema[:len(EXPECTED_INPUTS)]}, "
                        f"expected {EXPECTED_INPUTS}")

    context = library.context(threads)
    print(f"libqmoe context: {context.isa}, {context.num_threads} threads")
    rng = np.random.default_rng(20260418)
    for block in BLOCKS:
        for swiglu_name, swiglu in SWIGLUS.items():
            layer = ort_qmoe.QMoELayer(EXPERTS, HIDDEN, INTER, block, rng,
                                       fc1_exp=FC1_EXPONENTS[swiglu_name])
            runners = {level: ort_qmoe.QMoERunner(ort_qmoe.qmoe_model([layer], K, swiglu, level),
                                                  threads, 1, HIDDEN)
                       for level in ort_qmoe.accuracy_levels()}
            clamped = 0
            # The same layer with FP16 scales in the grouped order and codes in huge-page
            # weight memory (the form qmoe run uses): same values, so the same bits.
            grouped_set = layer.expert_set(library, swiglu, fp16_scales="grouped")
            with layer.expert_set(library, swiglu) as expert_set, grouped_set:
                for m in TOKENS:
                    case = f"block {block}, {swiglu_name}, M={m}"
                    x = rng.uniform(-1.0, 1.0, size=(m, HIDDEN)).astype(np.float32)
                    logits = qmoe_parity.draw_logits(rng, m, EXPERTS, K)
                    outputs = {
                        qmoe_parity.QMOE_EXACT: library.moe_forward_logits(
                            context, expert_set, libqmoe.QMOE_ACCURACY_EXACT, x, logits, K),
                        qmoe_parity.QMOE_FAST: library.moe_forward_logits(
                            context, expert_set, libqmoe.QMOE_ACCURACY_FAST, x, logits, K),
                        **ort_outputs(runners, x, logits),
                    }
                    results, clamped_now = qmoe_parity.check_outputs(layer, swiglu, x, logits,
                                                                     K, outputs)
                    clamped += clamped_now

                    ids, weights = library.route_topk(logits, K)
                    want_ids = qmoe_parity.route(logits, K)[0]
                    if not np.array_equal(ids, want_ids):
                        failures.append(f"{case}: qmoe_moe_route_topk chose {ids.tolist()}, "
                                        f"the reference {want_ids.tolist()}")
                    routed = library.moe_forward(context, expert_set,
                                                 libqmoe.QMOE_ACCURACY_EXACT, x, ids, weights)
                    if not np.array_equal(routed, outputs[qmoe_parity.QMOE_EXACT]):
                        failures.append(f"{case}: qmoe_moe_forward on qmoe_moe_route_topk's "
                                        "routes differs from qmoe_moe_forward on logits")

                    for level, name in ((libqmoe.QMOE_ACCURACY_EXACT, qmoe_parity.QMOE_EXACT),
                                        (libqmoe.QMOE_ACCURACY_FAST, qmoe_parity.QMOE_FAST)):
                        grouped = library.moe_forward_logits(context, grouped_set, level, x,
                                                             logits, K)
                        if not np.array_equal(grouped, outputs[name]):
                            failures.append(f"{case}: {name} with grouped FP16 scales differs "
                                            "from FP32 scales read in place")

                    print(f"{case}: worst error / bound: " +
                          ", ".join(f"{name} {ratio:.2g}" for name, ratio in results))
                    failures += [f"{case}: {name}: worst error is {ratio:.3g} x the bound"
                                 for name, ratio in results if not ratio <= 1.0]
            if block == 32:
                failures += check_fp16(library, context, layer, swiglu, swiglu_name, threads,
                                       rng)
            if swiglu[2] != float("inf") and clamped == 0:
                failures.append(f"block {block}, {swiglu_name}: no SwiGLU input reached the "
                                "limit; the case does not test the clamp")
    context.close()

    if failures:
        print(f"FAIL: {len(failures)} check(s) failed:")
        for failure in failures:
            print(f"  {failure}")
        return 1
    print("PASS: libqmoe and ONNX Runtime's QMoE agree within the documented bounds")
    return 0


if __name__ == "__main__":
    sys.exit(main())
