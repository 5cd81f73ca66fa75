"""FP64 reference of a MoE layer and per-output error bounds, to check libqmoe and ONNX
Runtime's QMoE against it and against each other.

Why: a parity test is only as good as its tolerance. The bounds here are the ones
docs/abi.md describes for qmoe_moe_forward (and tests/moe/moe_reference.cc implements in C++),
composed from the per-GEMM bounds of docs/formats.md, computed per output from FP64 values:
  FC1       |h' - h| <= e_h: FP32 activations 1e-5 * sum_k |x_k w_k|; int8 activations
            additionally the rounding of x (see below).
  SwiGLU    s(g) = g sigmoid(alpha g) has |s'| <= 1.1 for every alpha and the clamps are
            1-Lipschitz: |a' - a| <= 1.1 e_g (|u + beta| + e_u) + (|s| + 1.1 e_g) e_u, plus
            4e-6 (|s| + 1.1 e_g)(|u| + |beta| + e_u) for the FP32 evaluation.
  FC2       sum_i |W2[n, i]| da_i plus the level's GEMM bound at |a| + da.
  combine   sum_j w_j (FC2 error of slot j) + 1e-6 sum_j (w_j |y2_j| + w_j e2_j) for the FP32
            products and sums (any order of up to 16 terms: ORT sums per thread, then threads).
  routing   the weights are FP32 softmaxes over the k selected logits, against FP64 here:
            relative error <= (k + 4 + spread) 2^-24 (the subtraction l - max, expf within an
            ulp, k - 1 sums, a reciprocal and a product; spread = max - min selected logit),
            times w_j (|y2_j| + e2_j).
Three activation models:
  "fp32"       libqmoe's exact level and ORT accuracy_level 0.
  "qmoe_fast"  libqmoe's fast level: x and a quantized per 32 k exactly as docs/formats.md
               says (x's int8 rows reproduced bit for bit; a's within the perturbation, with
               one step more where a value lies near a rounding boundary), as
               tests/moe/moe_reference.cc does.
  "int8"       the same quantization per `chunk` consecutive k (ORT accuracy_level 4: MLAS's
               int8 kernels quantize activations per block of the weights, 32, 64 or 128 k,
               with the same step max|.| / 127 and rounding to nearest), for x as well as a
               within a perturbation: x's rows are not reproduced bit for bit, so a value
               within 1e-4 of a step of a rounding boundary may differ by one step.
Pairs are compared within the sum of their two bounds plus the distance between their FP64
references (which differ when the two sides quantize activations in different chunks).
FP16 outputs (libqmoe's typed forward, ORT's QMoE with T = float16) add their rounding to
FP16: 2^-11 (|y| + bound), and 2^-25 absolute below FP16's normal range (fp16_rounding()).
"""

import math

import numpy as np

F32_EPS = 2.0 ** -24  # unit roundoff of FP32


def route(logits, k):
    """FP64 routing of float32 logits [M, E]: ids [M, k] (descending logit, equal logits: lower
    id first), renormalised softmax weights [M, k] and each row's selected spread."""
    values = logits.astype(np.float64)
    order = np.argsort(-values, axis=1, kind="stable")
    ids = order[:, :k]
    selected = np.take_along_axis(values, ids, axis=1)
    w = np.exp(selected - selected[:, :1])
    w /= w.sum(axis=1, keepdims=True)
    return ids, w, selected[:, 0] - selected[:, -1]


def boundary_ties(logits, k):
    """Rows whose k-th and (k+1)-th largest logits are equal (where ORT, which ranks equal
    logits higher id first, and libqmoe, lower id first, may select different experts)."""
    if k >= logits.shape[1]:
        return np.zeros(logits.shape[0], dtype=bool)
    s = -np.sort(-logits, axis=1)
    return s[:, k - 1] == s[:, k]


def draw_logits(rng, m, experts, k, dtype=np.float32):
    """Random router logits [m, experts] of `dtype` (float32 or float16; N(0, 4)) with no tie
    at the top-k boundary, where ORT and libqmoe could select different experts. The check is
    made after rounding to `dtype`: FP32 logits that differ can round to the same FP16 value
    (about one M = 4 draw in 40 did), and then the two sides route differently."""
    while True:
        logits = (2.0 * rng.standard_normal((m, experts))).astype(np.float32).astype(dtype)
        if not boundary_ties(logits, k).any():
            return logits


# A chunk whose max|x| is below this quantizes to 0 (lib/formats/int4_layout.h, kQ8FlushBelow).
Q8_FLUSH_BELOW = 2.0 ** -119


def _chunks(a, chunk):
    return a.reshape(a.shape[0], a.shape[1] // chunk, chunk)


def _q8_fast_rows(x):
    """libqmoe's fast-level activation rows (docs/formats.md), in the same FP32 operations:
    per 32 k, s = max|x| / 127, q = rint(x * (127 / max|x|)), and q = 0, s = 0 where max|x| is
    below 2^-119 (zero included); returns s * q in FP64."""
    c = _chunks(x.astype(np.float32), 32)
    amax = np.abs(c).max(axis=2, keepdims=True)
    keep = amax >= np.float32(Q8_FLUSH_BELOW)
    safe = np.where(keep, amax, np.float32(1.0)).astype(np.float32)
    s = np.where(keep, safe / np.float32(127.0), np.float32(0.0)).astype(np.float32)
    inv = np.where(keep, np.float32(127.0) / safe, np.float32(0.0)).astype(np.float32)
    q = np.clip(np.rint(c * inv), -127, 127)
    return (s.astype(np.float64) * q.astype(np.float64)).reshape(x.shape)


def _q8_bound(a, da, chunk):
    """Activations within da of `a` (FP64), quantized per `chunk` k with step max|.| / 127 and
    rounding to nearest: the dequantized values of `a` itself and a per-element bound on the
    difference to the implementation's (tests/moe/moe_reference.cc, dequantized_q8_bound, per
    `chunk`): the step moves by at most max(da) / 127 (times |q| <= 127), and q can differ by
    one only where a * 127 / max|a| lies within the perturbation (plus 1e-4, FP32 evaluation
    of the scaling) of a rounding boundary k + 1/2."""
    c, dc = _chunks(a, chunk), _chunks(da, chunk)
    amax = np.abs(c).max(axis=2, keepdims=True)
    damax = dc.max(axis=2, keepdims=True)
    s = amax / 127.0
    scale_shift = damax + 1e-6 * amax
    flushed = amax + damax < Q8_FLUSH_BELOW  # quantized to 0 whatever the perturbation
    # All perturbation, or on either side of the flush: any q is possible.
    all_perturbation = (amax <= 2 * damax) | (amax - damax < Q8_FLUSH_BELOW)
    denominator = np.where(all_perturbation, 1.0, amax - damax)
    safe_amax = np.where(all_perturbation, 1.0, amax)
    t = c * 127.0 / safe_amax
    q = np.clip(np.rint(t), -127, 127)
    margin = 127.0 * (dc + np.abs(c) * damax / denominator) / denominator + 1e-4
    to_boundary = np.abs(np.abs(t - np.trunc(t)) - 0.5)
    near = to_boundary <= margin
    out = np.where(flushed, 0.0, np.where(all_perturbation, c, s * q))
    bound = np.where(flushed, amax + damax,
                     np.where(all_perturbation, 2 * (amax + damax),
                              scale_shift + np.where(near, s + damax / 127.0, 0.0)))
    return out.reshape(a.shape), bound.reshape(a.shape)


class Reference:
    """FP64 layer output y [M, H], bound tol [M, H], and `clamped`: SwiGLU inputs the limit
    changed (to show that a test exercises it)."""

    def __init__(self, y, tol, clamped):
        self.y, self.tol, self.clamped = y, tol, clamped


def reference(layer, swiglu, x, logits, k, activations, chunk=32):
    """Reference of the MoE layer (python/ort_qmoe.py QMoELayer, gate/up interleaved) on
    float32 x [M, H] with router logits [M, E], routed as route(); `activations` is "fp32",
    "qmoe_fast" or "int8" (quantized per `chunk`), see the module docstring."""
    alpha, beta, limit = swiglu
    m, hidden = x.shape
    ids, weights, spread = route(logits, k)
    route_rel = (k + 4 + spread) * F32_EPS
    x64 = x.astype(np.float64)
    if activations == "qmoe_fast":
        xin, xstep = _q8_fast_rows(x), np.zeros_like(x64)
    elif activations == "int8":
        xin, xstep = _q8_bound(x64, np.zeros_like(x64), chunk)
    else:
        xin, xstep = x64, np.zeros_like(x64)
    y = np.zeros((m, hidden))
    tol = np.zeros((m, hidden))
    magnitude = np.zeros((m, hidden))
    routing = np.zeros((m, hidden))
    clamped = 0
    for e in np.unique(ids):
        tokens, slots = np.nonzero(ids == e)
        w1, w2 = layer.dense_fc1(e), layer.dense_fc2(e)
        a1, a2 = np.abs(w1), np.abs(w2)
        xe, se = xin[tokens], xstep[tokens]
        h = xe @ w1.T
        eh = se @ a1.T + 1e-5 * ((np.abs(xe) + se) @ a1.T)
        g, u = h[:, 0::2], h[:, 1::2]  # swiglu_fusion = 1: gate row 2i, up row 2i + 1
        eg, eu = eh[:, 0::2], eh[:, 1::2]
        if math.isfinite(limit):
            clamped += int((g > limit).sum() + (np.abs(u) > limit).sum())
            g = np.minimum(g, limit)
            u = np.clip(u, -limit, limit)
        s = g / (1.0 + np.exp(-alpha * g))
        a = s * (u + beta)
        da = (1.1 * eg * (np.abs(u + beta) + eu) + (np.abs(s) + 1.1 * eg) * eu +
              4e-6 * (np.abs(s) + 1.1 * eg) * (np.abs(u) + abs(beta) + eu))
        if activations == "qmoe_fast":
            ain, dain = _q8_bound(a, da, 32)
        elif activations == "int8":
            ain, dain = _q8_bound(a, da, chunk)
        else:
            ain, dain = a, da
        y2 = ain @ w2.T
        e2 = dain @ a2.T + 1e-5 * ((np.abs(ain) + dain) @ a2.T)
        w = weights[tokens, slots][:, None]
        y[tokens] += w * y2
        tol[tokens] += w * e2
        magnitude[tokens] += w * (np.abs(y2) + e2)
        routing[tokens] += route_rel[tokens][:, None] * w * (np.abs(y2) + e2)
    return Reference(y, tol + 1e-6 * magnitude + routing + 1e-30, clamped)


def fp16_rounding(ref):
    """`ref` with its bound widened by the rounding of the output to FP16 (round to nearest:
    half a step, 2^-11 relative in the normal range, 2^-25 absolute below it)."""
    return Reference(ref.y, ref.tol + 2.0 ** -11 * (np.abs(ref.y) + ref.tol) + 2.0 ** -25,
                     ref.clamped)


def worst_ratio(got, want, tol):
    """Largest |got - want| / tol over the outputs (<= 1: within the bound)."""
    return float((np.abs(got.astype(np.float64) - want) / tol).max())


# Output names check_outputs() knows, and how each quantizes its activations.
QMOE_EXACT, QMOE_FAST, ORT_LEVEL0, ORT_LEVEL4 = ("qmoe exact", "qmoe fast", "ORT level 0",
                                                 "ORT level 4")


def check_outputs(layer, swiglu, x, logits, k, outputs, fp16=False):
    """Every check that applies to `outputs` (name -> y [M, H], names above): each output
    against its FP64 reference within its bound ("fp32" for qmoe exact and ORT level 0,
    "qmoe_fast" for qmoe fast, "int8" per weight block for ORT level 4), and qmoe exact against
    ORT level 0, qmoe fast against ORT level 4, within the sum of the two sides' bounds plus
    the distance between their references. `fp16`: the outputs are FP16 (x and logits being
    the FP32 values of FP16 inputs), and every bound adds the rounding to FP16. Returns
    (description, worst error / bound) per check, a ratio above 1 being a failure, and the
    number of clamped SwiGLU inputs."""
    widen = fp16_rounding if fp16 else (lambda ref: ref)
    fp32 = widen(reference(layer, swiglu, x, logits, k, "fp32"))
    fast = widen(reference(layer, swiglu, x, logits, k, "qmoe_fast"))
    int8 = widen(reference(layer, swiglu, x, logits, k, "int8", chunk=layer.block))
    results = []
    # (libqmoe level, its reference), (the ORT level it pairs with, that level's reference).
    for (qmoe, qmoe_ref), (ort, ort_ref) in (((QMOE_EXACT, fp32), (ORT_LEVEL0, fp32)),
                                             ((QMOE_FAST, fast), (ORT_LEVEL4, int8))):
        if qmoe in outputs:
            results.append((f"{qmoe} vs FP64",
                            worst_ratio(outputs[qmoe], qmoe_ref.y, qmoe_ref.tol)))
        if ort in outputs:
            results.append((f"{ort} vs FP64", worst_ratio(outputs[ort], ort_ref.y, ort_ref.tol)))
            if qmoe in outputs:
                # Both sides' bounds plus the distance between their references (0 when they
                # share one, as exact and level 0 do).
                results.append((f"{qmoe} vs {ort}",
                                worst_ratio(outputs[qmoe], outputs[ort],
                                            qmoe_ref.tol + ort_ref.tol +
                                            np.abs(qmoe_ref.y - ort_ref.y))))
    return results, fp32.clamped
