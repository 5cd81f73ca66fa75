#!/usr/bin/env python3
"""Argument checks of python/libqmoe.py: what the wrapper must refuse before calling into C,
and what it must still accept.

Why: the library takes bare pointers, so whatever the ctypes wrapper passes it is trusted. A
review found four ways in which valid-looking numpy arguments made the library write outside
its output, read outside its input, or compute with silently changed values:
  1. import_onnx_codes(out=...) checked only out.nbytes: a reversed view (whose data pointer
     is its last element) was written past its end, a strided view between its elements;
  2. import_onnx_matrix did not check the scale array against scale_dtype and the strides:
     float16 scales described as QMOE_DTYPE_F32, or strides beyond the array, read past it;
  3. ids (moe_forward) and codes (import_onnx_codes, expert_set_from_onnx) were cast unsafely:
     int64 2**32 + 1 and float 1.9 both became expert 1, int64 code 300 became 44;
  4. outputs were not checked for writeability: y over an immutable bytes object was written.
A second review found four more:
  5. scalar integers (num_threads, n, k, block_size, strides, top-k, accuracy) went through
     ctypes, which drops the high bits: k = 2**32 + 2 ran as k = 2;
  6. describe_matrix did not compare the codes with codes_size(n, k): the library read past a
     short array;
  7. forward_logits_call kept the arrays but not the expert set: a set built inside the call
     expression was collected with its weights, and the call read freed memory;
  8. qmoe_parity.draw_logits checked for top-k boundary ties before the FP16 rounding that
     makes new ones (about one M = 4 draw in 40), so ORT and libqmoe routed differently.
Each refusal is checked to raise ValueError or TypeError (the wrapper's own check, not a
QmoeError from the library) and to leave the output buffer and the guard bytes on both sides
of it as they were: every output lives between two guards of its own length, so a write
misplaced by up to its length is seen. Scale planes used by the valid cases lie between NaN
guards, so a read outside them shows as NaN in y.

The valid forms still work: import_onnx_codes into a guarded out (same codes as without out,
guards intact); qmoe_gemm with FP32 scales in place, FP16 [K/block, N], BF16 bits and FP16 in
the grouped order, against an FP64 reference within the exact level's bound (1e-5 sum|x w|);
qmoe_moe_forward on qmoe_moe_route_topk's routes against the FP64 reference of
python/qmoe_parity.py within its bound, equal bit for bit to qmoe_moe_forward on logits, to the
grouped-FP16 expert set, to int64 / int8 ids and int16 / int32 codes converted losslessly, and
read-only inputs.

Every weight format (issue 21: the wrapper built INT4 only): Library.matrix for INT4, INT3,
MXFP4 and NVFP4 (scales in place and grouped, between NaN guards; a partial row group; NVFP4's
half-filled last chunk and global scale), the four importers (their canonical bytes against
the NumPy encoding of the same codes), and Library.expert_set with all four formats in one
set. Products are checked at both levels, at M = 1 and 3, against FP64 references that
tests/python/canonical_formats.py decodes from the bytes as docs/formats.md describes them
(never through the library), within the documented bounds; canonical_formats.py is itself held
to the document's worked examples. Each new function has refusals: unknown formats, codes
sized for another format, scale planes of the wrong type or too short, global scales FP32
cannot hold or would read as "none", importer sources and outputs of the wrong size, type or
writeability, and expert sets of non-matrices or unequal lengths.

Usage: python_wrapper_test.py path/to/libqmoe.so
Exit status: 0 pass, 1 failure (each failing check printed), 77 skipped (numpy cannot be
imported; the reason is printed).
"""

import gc
import os
import sys
import tempfile
import traceback

try:
    import numpy as np
except ImportError as error:
    print(f"SKIP: python_wrapper_test needs numpy ({error}); python3 -m pip install numpy")
    sys.exit(77)

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "python"))
import canonical_formats  # noqa: E402  (tests/python, beside this file)
import libqmoe  # noqa: E402
import qmoe_parity  # noqa: E402

EXPERTS, TOP_K, HIDDEN, INTER, BLOCK = 4, 2, 64, 32, 32
QWEN3_SWIGLU = (1.0, 0.0, float("inf"))  # alpha, beta, limit
EXACT = libqmoe.QMOE_ACCURACY_EXACT
GUARD_FILL = 0xA5  # output guards: any write shows
NAN_FILL = 0xFF    # scale guards: all-ones bits are NaN in FP32, FP16 and BF16


class Guarded:
    """`shape` elements of `dtype` (`payload`) between two guards of the payload's length
    rounded up to 64 bytes (so the payload stays 64-byte aligned), every byte `fill`.
    read_only: over an immutable bytes object instead (np.frombuffer), as a caller could pass.
    """

    def __init__(self, shape, dtype, fill=GUARD_FILL, read_only=False):
        dtype = np.dtype(dtype)
        nbytes = int(np.prod(shape)) * dtype.itemsize
        self.pad = -(-max(nbytes, 1) // 64) * 64
        total = 2 * self.pad + nbytes
        if read_only:
            self.whole = np.frombuffer(bytes([fill]) * total, dtype=np.uint8)
        else:
            self.whole = libqmoe.aligned_empty(total)
            self.whole.fill(fill)
        self.nbytes, self.fill = nbytes, fill
        self.payload = self.whole[self.pad:self.pad + nbytes].view(dtype).reshape(shape)
        self.snapshot = self.whole.copy()

    def unchanged(self):
        """No byte of the guards or of the payload differs from when it was made."""
        return np.array_equal(self.whole, self.snapshot)

    def guards_intact(self):
        return bool((self.whole[:self.pad] == self.fill).all() and
                    (self.whole[self.pad + self.nbytes:] == self.fill).all())


class Layer:
    """A small random MoE layer in ONNX Runtime's QMoE layout: the attributes
    qmoe_parity.reference reads of python/ort_qmoe.py's QMoELayer (which needs onnx):
    fc1 uint8 [E, 2I, H/2], fc2 uint8 [E, H, I/2], FP16-representable FP32 scales."""

    def __init__(self, rng):
        self.block = BLOCK
        self.fc1 = rng.integers(0, 256, size=(EXPERTS, 2 * INTER, HIDDEN // 2), dtype=np.uint8)
        self.fc2 = rng.integers(0, 256, size=(EXPERTS, HIDDEN, INTER // 2), dtype=np.uint8)
        self.fc1_scales = random_scales(rng, (EXPERTS, 2 * INTER, HIDDEN // BLOCK))
        self.fc2_scales = random_scales(rng, (EXPERTS, HIDDEN, INTER // BLOCK))

    def dense_fc1(self, e):
        return dense(self.fc1[e], self.fc1_scales[e])

    def dense_fc2(self, e):
        return dense(self.fc2[e], self.fc2_scales[e])

    def expert_set(self, library, **kwargs):
        alpha, beta, limit = QWEN3_SWIGLU
        arguments = dict(fc1=self.fc1, fc1_scales=self.fc1_scales, fc2=self.fc2,
                         fc2_scales=self.fc2_scales, block_size=BLOCK, alpha=alpha, beta=beta,
                         limit=limit)
        arguments.update(kwargs)
        return library.expert_set_from_onnx(**arguments)


def random_scales(rng, shape):
    """Scales of magnitude 2^[-8, -5) and random sign whose values FP16 and BF16 hold exactly
    (8 significant bits), so that every scale form describes the same matrix."""
    magnitude = np.exp2(rng.uniform(-8.0, -5.0, size=shape))
    sign = np.where(rng.integers(0, 2, size=shape) == 1, -1.0, 1.0)
    bf16 = ((sign * magnitude).astype(np.float32).view(np.uint32) & 0xFFFF0000)
    return bf16.view(np.float32)


def dense(codes, scales):
    """W [N, K] in float64 from ORT's uint8 [N, K/2] (even k in the low nibble, zero point 8)
    and FP32 scales [N, K/block]."""
    low, high = (codes & 0x0F).astype(np.int16), (codes >> 4).astype(np.int16)
    q = np.stack([low, high], axis=-1).reshape(codes.shape[0], -1)
    return (q - 8).astype(np.float64) * np.repeat(scales.astype(np.float64), BLOCK, axis=1)


class Checks:
    """Collects failures; every check prints one line."""

    def __init__(self):
        self.failures = []

    def expect(self, condition, what):
        print(f"{'ok' if condition else 'FAILED'}: {what}")
        if not condition:
            self.failures.append(what)

    def refused(self, what, call, *buffers):
        """`call` must raise ValueError or TypeError (the wrapper's own check: a QmoeError
        would mean the library was called) and leave every Guarded in `buffers` as it was."""
        try:
            call()
        except (ValueError, TypeError) as error:
            outcome = None
            print(f"ok: {what}: refused ({type(error).__name__}: {error})")
        except Exception as error:  # noqa: BLE001 (anything else is the failure reported)
            outcome = f"raised {type(error).__name__} ({error}), not ValueError or TypeError"
        else:
            outcome = "accepted"
        if outcome is not None:
            print(f"FAILED: {what}: {outcome}")
            self.failures.append(f"{what}: {outcome}")
        for buffer in buffers:
            self.expect(buffer.unchanged(), f"{what}: buffer and guard bytes untouched")


def within_gemm_bound(y, x, w):
    """|y - x W^T| <= 1e-5 sum_k |x_k w_k| per output (the exact level's bound, docs/abi.md),
    y finite (a NaN from a scale guard fails)."""
    x64 = x.astype(np.float64)
    want = x64 @ w.T
    tol = 1e-5 * (np.abs(x64) @ np.abs(w).T) + 1e-30
    return bool(np.isfinite(y).all() and (np.abs(y.astype(np.float64) - want) <= tol).all())


def check_codes_out(library, checks, rng):
    """Defect 1: import_onnx_codes' out, and defect 3 for its codes."""
    n, k = 16, 64
    size = library.codes_size(n, k)
    onnx = rng.integers(0, 256, size=(n, k // 2), dtype=np.uint8)
    want = library.import_onnx_codes(onnx, n, k)

    good = Guarded((size,), np.uint8)
    got = library.import_onnx_codes(onnx, n, k, good.payload)
    checks.expect(np.shares_memory(got, good.payload) and np.array_equal(got, want) and
                  good.guards_intact(),
                  "import_onnx_codes into a guarded out: the codes, in out, guards intact")

    reversed_out = Guarded((size,), np.uint8)
    checks.refused("import_onnx_codes, out reversed (buf[::-1])",
                   lambda: library.import_onnx_codes(onnx, n, k, reversed_out.payload[::-1]),
                   reversed_out)
    strided_out = Guarded((2 * size,), np.uint8)
    checks.refused("import_onnx_codes, out strided (big[::2])",
                   lambda: library.import_onnx_codes(onnx, n, k, strided_out.payload[::2]),
                   strided_out)
    int8_out = Guarded((size,), np.int8)
    checks.refused("import_onnx_codes, out int8 of the right size",
                   lambda: library.import_onnx_codes(onnx, n, k, int8_out.payload), int8_out)
    u16_out = Guarded((size // 2,), np.uint16)
    checks.refused("import_onnx_codes, out uint16 of the right byte count",
                   lambda: library.import_onnx_codes(onnx, n, k, u16_out.payload), u16_out)
    short_out = Guarded((size - 1,), np.uint8)
    checks.refused("import_onnx_codes, out one byte short",
                   lambda: library.import_onnx_codes(onnx, n, k, short_out.payload), short_out)
    read_only_out = Guarded((size,), np.uint8, read_only=True)
    checks.refused("import_onnx_codes, out over an immutable bytes object",
                   lambda: library.import_onnx_codes(onnx, n, k, read_only_out.payload),
                   read_only_out)

    for what, codes in (("int64 300", np.full((n, k // 2), 300, dtype=np.int64)),
                        ("int64 -1", np.full((n, k // 2), -1, dtype=np.int64)),
                        ("float64 44.9", np.full((n, k // 2), 44.9)),
                        ("float64 44.0", np.full((n, k // 2), 44.0)),
                        ("bool", np.ones((n, k // 2), dtype=bool))):
        out = Guarded((size,), np.uint8)
        checks.refused(f"import_onnx_codes, codes {what}",
                       lambda codes=codes, out=out: library.import_onnx_codes(codes, n, k,
                                                                              out.payload),
                       out)
    for dtype in (np.int16, np.int64, np.uint32):
        got = library.import_onnx_codes(onnx.astype(dtype), n, k)
        checks.expect(np.array_equal(got, want),
                      f"import_onnx_codes, codes {np.dtype(dtype).name} in [0, 255]: the same "
                      "codes as uint8")


def check_scales(library, checks, context, rng):
    """Defect 2: the scale plane against scale_dtype and the strides; the valid forms by
    qmoe_gemm against FP64, their planes between NaN guards, y between guards."""
    n, k, m = 16, 64, 3
    blocks = k // BLOCK
    onnx = rng.integers(0, 256, size=(n, k // 2), dtype=np.uint8)
    scales = random_scales(rng, (n, blocks))
    w = dense(onnx, scales)
    x = rng.uniform(-1.0, 1.0, size=(m, k)).astype(np.float32)

    def guarded_plane(values, dtype):
        plane = Guarded(values.shape, dtype, fill=NAN_FILL)
        plane.payload[...] = values
        return plane

    f32 = guarded_plane(scales, np.float32)
    f16 = guarded_plane(scales.T.astype(np.float16), np.float16)  # [K/block, N]
    bf16 = guarded_plane(scales.view(np.uint32) >> 16, np.uint16)  # BF16 bits, [N, K/block]
    grouped = guarded_plane(library.grouped_planes(scales.astype(np.float16)[None])[0],
                            np.float16)
    forms = (
        ("FP32 [N, K/block] in place", f32, libqmoe.QMOE_DTYPE_F32, (blocks, 1, 0)),
        ("FP16 [K/block, N]", f16, libqmoe.QMOE_DTYPE_F16, (1, n, 0)),
        ("BF16 bits (uint16) [N, K/block]", bf16, libqmoe.QMOE_DTYPE_BF16, (blocks, 1, 0)),
        ("FP16 grouped", grouped, libqmoe.QMOE_DTYPE_F16, (1, 8, 8 * blocks)),
    )
    for what, plane, dtype, (row, block, group) in forms:
        if group:
            codes = library.import_onnx_codes(onnx, n, k)
            struct = library.describe_matrix(codes, n, k, BLOCK, plane.payload, dtype, row,
                                             block, group)
            matrix = libqmoe.Matrix(struct, (codes, plane.payload), codes.nbytes)
        else:
            matrix = library.import_onnx_matrix(onnx, n, k, BLOCK, plane.payload, dtype, row,
                                                block)
        y = Guarded((m, n), np.float32)
        got = library.gemm(context, matrix, EXACT, x, y.payload)
        checks.expect(np.shares_memory(got, y.payload) and within_gemm_bound(got, x, w) and
                      y.guards_intact(),
                      f"qmoe_gemm, scales {what}: within the FP64 bound, no NaN from the scale "
                      "guards, y's guards intact")

    flat = scales.reshape(-1)
    checks.expect(library.import_onnx_matrix(onnx, n, k, BLOCK, flat, libqmoe.QMOE_DTYPE_F32,
                                             blocks, 1) is not None,
                  "import_onnx_matrix, scales exactly as long as the strides address")
    wrong = (
        ("float16 scales described as F32", scales.astype(np.float16), libqmoe.QMOE_DTYPE_F32,
         (blocks, 1)),
        ("float32 scales described as F16", scales.T.copy(), libqmoe.QMOE_DTYPE_F16, (1, n)),
        ("float32 scales described as BF16", scales, libqmoe.QMOE_DTYPE_BF16, (blocks, 1)),
        ("float64 scales described as F32", scales.astype(np.float64), libqmoe.QMOE_DTYPE_F32,
         (blocks, 1)),
        ("big-endian float32 described as F32", scales.astype(">f4"), libqmoe.QMOE_DTYPE_F32,
         (blocks, 1)),
        ("an unknown scale_dtype", scales, 99, (blocks, 1)),
        ("scales one element short of the strides", flat[:-1], libqmoe.QMOE_DTYPE_F32,
         (blocks, 1)),
        ("scales [N, K/block - 1] at row stride K/block", scales[:, :-1].copy(),
         libqmoe.QMOE_DTYPE_F32, (blocks, 1)),
        ("a row stride twice the plane's", scales, libqmoe.QMOE_DTYPE_F32, (2 * blocks, 1)),
        ("a block stride past the plane", scales, libqmoe.QMOE_DTYPE_F32, (blocks, n)),
    )
    for what, plane, dtype, (row, block) in wrong:
        checks.refused(f"import_onnx_matrix, {what}",
                       lambda plane=plane, dtype=dtype, row=row, block=block:
                       library.import_onnx_matrix(onnx, n, k, BLOCK, plane, dtype, row, block))
    codes = library.import_onnx_codes(onnx, n, k)
    short_grouped = grouped.payload[:-1].copy()
    checks.refused("describe_matrix, grouped plane one element short of the group stride's "
                   "extent",
                   lambda: library.describe_matrix(codes, n, k, BLOCK, short_grouped,
                                                   libqmoe.QMOE_DTYPE_F16, 1, 8, 8 * blocks))

    matrix = library.import_onnx_matrix(onnx, n, k, BLOCK, scales, libqmoe.QMOE_DTYPE_F32,
                                        blocks, 1)
    read_only_y = Guarded((m, n), np.float32, read_only=True)
    checks.refused("qmoe_gemm, y over an immutable bytes object",
                   lambda: library.gemm(context, matrix, EXACT, x, read_only_y.payload),
                   read_only_y)
    read_only_x = np.frombuffer(x.tobytes(), dtype=np.float32).reshape(m, k)
    checks.expect(np.array_equal(library.gemm(context, matrix, EXACT, read_only_x),
                                 library.gemm(context, matrix, EXACT, x)),
                  "qmoe_gemm, a read-only x: accepted, the same y")


def check_integer_arguments(library, checks, context, rng):
    """Defects 5 and 6: scalar integers out of their C type's range, a short codes array, and
    a zero block size (which used to raise ZeroDivisionError from the shape check)."""
    n, k = 16, 64
    blocks = k // BLOCK
    onnx = rng.integers(0, 256, size=(n, k // 2), dtype=np.uint8)
    scales = random_scales(rng, (n, blocks))
    codes = library.import_onnx_codes(onnx, n, k)
    checks.refused("context, num_threads 2**32 + 1 (was: a 1-thread context)",
                   lambda: library.context(2**32 + 1))
    checks.refused("context, num_threads -1", lambda: library.context(-1))
    checks.refused("codes_size, n 2**32 + 8 (was: the size of n = 8)",
                   lambda: library.codes_size(2**32 + 8, k))
    checks.refused("import_onnx_codes, k 2**32 + 64",
                   lambda: library.import_onnx_codes(onnx, n, 2**32 + k))
    checks.refused("describe_matrix, codes one byte short of codes_size(n, k)",
                   lambda: library.describe_matrix(codes[:-1].copy(), n, k, BLOCK, scales,
                                                   libqmoe.QMOE_DTYPE_F32, blocks, 1))
    checks.refused("describe_matrix, a float n",
                   lambda: library.describe_matrix(codes, float(n), k, BLOCK, scales,
                                                   libqmoe.QMOE_DTYPE_F32, blocks, 1))
    checks.refused("describe_matrix, block stride 2**64",
                   lambda: library.describe_matrix(codes, n, k, BLOCK, scales,
                                                   libqmoe.QMOE_DTYPE_F32, blocks, 2**64))
    matrix = library.import_onnx_matrix(onnx, n, k, BLOCK, scales, libqmoe.QMOE_DTYPE_F32,
                                        blocks, 1)
    x = rng.uniform(-1.0, 1.0, size=(2, k)).astype(np.float32)
    y = Guarded((2, n), np.float32)
    checks.refused("qmoe_gemm, accuracy 2**32 + 1 (was: EXACT)",
                   lambda: library.gemm(context, matrix, 2**32 + EXACT, x, y.payload), y)
    layer = Layer(rng)
    checks.refused("expert_set_from_onnx, block_size 0",
                   lambda: layer.expert_set(library, block_size=0))
    logits = qmoe_parity.draw_logits(rng, 2, EXPERTS, TOP_K)
    checks.refused("route_topk, k 2**32 + TOP_K (was: TOP_K)",
                   lambda: library.route_topk(logits, 2**32 + TOP_K))
    xm = rng.uniform(-1.0, 1.0, size=(2, HIDDEN)).astype(np.float32)
    with layer.expert_set(library) as expert_set:
        ids, weights = library.route_topk(logits, TOP_K)
        out = Guarded((2, HIDDEN), np.float32)
        checks.refused("qmoe_moe_forward, accuracy 2**32 + 1",
                       lambda: library.moe_forward(context, expert_set, 2**32 + EXACT, xm, ids,
                                                   weights, out.payload), out)
        out = Guarded((2, HIDDEN), np.float32)
        checks.refused("forward_logits_call, k 2**32 + TOP_K",
                       lambda: library.forward_logits_call(context, expert_set, EXACT, xm,
                                                           logits, 2**32 + TOP_K, out.payload),
                       out)


def check_parity_logits(checks, rng):
    """Defect 8: FP16 logits from draw_logits have no tie at the top-k boundary. At M = 32,
    E = 128, k = 8 about half of the FP32 draws tie once rounded to FP16."""
    tied = 0
    for _ in range(50):
        logits = qmoe_parity.draw_logits(rng, 32, 128, 8, np.float16)
        tied += logits.dtype != np.float16 or bool(qmoe_parity.boundary_ties(logits, 8).any())
    checks.expect(tied == 0, f"draw_logits(float16): {50 - tied} of 50 draws are float16 with "
                  "no tie at the top-k boundary")


def check_moe(library, checks, context, rng):
    """Defects 3 (ids, expert codes) and 4 (y) for the MoE layer; the valid forms against the
    FP64 reference and against each other."""
    layer = Layer(rng)
    m = 3
    x = rng.uniform(-1.0, 1.0, size=(m, HIDDEN)).astype(np.float32)
    logits = qmoe_parity.draw_logits(rng, m, EXPERTS, TOP_K)
    with layer.expert_set(library) as expert_set, \
            layer.expert_set(library, fp16_scales="grouped") as grouped_set:
        ids, weights = library.route_topk(logits, TOP_K)
        y = Guarded((m, HIDDEN), np.float32)
        got = library.moe_forward(context, expert_set, EXACT, x, ids, weights, y.payload)
        ref = qmoe_parity.reference(layer, QWEN3_SWIGLU, x, logits, TOP_K, "fp32")
        ratio = qmoe_parity.worst_ratio(got, ref.y, ref.tol)
        checks.expect(np.shares_memory(got, y.payload) and ratio <= 1.0 and y.guards_intact(),
                      f"qmoe_moe_forward into a guarded y: worst error / bound {ratio:.2g} "
                      "(<= 1), y's guards intact")
        checks.expect(np.array_equal(library.moe_forward_logits(context, expert_set, EXACT, x,
                                                                logits, TOP_K), got),
                      "qmoe_moe_forward on logits equals qmoe_moe_forward on route_topk's routes")
        checks.expect(np.array_equal(library.moe_forward(context, grouped_set, EXACT, x, ids,
                                                         weights), got),
                      "grouped FP16 scales in weight memory: the same y as FP32 in place")
        for dtype in (np.int64, np.int8, np.uint16):
            checks.expect(np.array_equal(library.moe_forward(context, expert_set, EXACT, x,
                                                             ids.astype(dtype), weights), got),
                          f"qmoe_moe_forward, ids {np.dtype(dtype).name}: the same y as int32")
        read_only_x = np.frombuffer(x.tobytes(), dtype=np.float32).reshape(m, HIDDEN)
        checks.expect(np.array_equal(library.moe_forward(context, expert_set, EXACT,
                                                         read_only_x, ids, weights), got),
                      "qmoe_moe_forward, a read-only x: accepted, the same y")

        # One token routed to expert 1 alone: what the bad ids below used to become.
        x1, w1 = x[:1], np.ones((1, 1), dtype=np.float32)
        for what, bad in (("int64 2**32 + 1", np.array([[2**32 + 1]], dtype=np.int64)),
                          ("int64 -2**31 - 1", np.array([[-2**31 - 1]], dtype=np.int64)),
                          ("uint64 2**63 + 1", np.array([[2**63 + 1]], dtype=np.uint64)),
                          ("float64 1.9", np.array([[1.9]])),
                          ("float64 1.0", np.array([[1.0]])),
                          ("bool", np.array([[True]]))):
            out = Guarded((1, HIDDEN), np.float32)
            checks.refused(f"qmoe_moe_forward, ids {what}",
                           lambda bad=bad, out=out: library.moe_forward(
                               context, expert_set, EXACT, x1, bad, w1, out.payload), out)

        for dtype, what in ((np.float32, "FP32"), (np.float16, "FP16")):
            xt = x.astype(dtype)
            read_only_y = Guarded((m, HIDDEN), dtype, read_only=True)
            checks.refused(f"qmoe_moe_forward ({what}), y over an immutable bytes object",
                           lambda xt=xt, out=read_only_y: library.moe_forward(
                               context, expert_set, EXACT, xt, ids, weights, out.payload),
                           read_only_y)
            read_only_y = Guarded((m, HIDDEN), dtype, read_only=True)
            checks.refused(f"forward_logits_call ({what}), y over an immutable bytes object",
                           lambda xt=xt, out=read_only_y: library.forward_logits_call(
                               context, expert_set, EXACT, xt, logits.astype(dtype), TOP_K,
                               out.payload), read_only_y)
        y = Guarded((m, HIDDEN), np.float32)
        library.forward_logits_call(context, expert_set, EXACT, x, logits, TOP_K, y.payload)()
        checks.expect(np.array_equal(y.payload, got) and y.guards_intact(),
                      "forward_logits_call into a guarded y: the same y, guards intact")

    # Defect 7: the call is all that holds the set (and its weights); collect everything else.
    y = Guarded((m, HIDDEN), np.float32)
    call = library.forward_logits_call(context, layer.expert_set(library), EXACT, x, logits,
                                       TOP_K, y.payload)
    for _ in range(3):
        gc.collect()
        # Reuse freed memory the way later work would (the defect read whatever lay there).
        scratch = [np.full(4096, 1e30, dtype=np.float32) for _ in range(64)]
    del scratch
    call()
    checks.expect(np.array_equal(y.payload, got) and y.guards_intact(),
                  "forward_logits_call on a set only the call holds, after gc: the same y")
    call.keep[3].close()

    bad_fc1 = layer.fc1.astype(np.int64)
    bad_fc1[1, 2, 3] = 300
    checks.refused("expert_set_from_onnx, fc1 int64 holding 300",
                   lambda: layer.expert_set(library, fc1=bad_fc1))
    checks.refused("expert_set_from_onnx, fc2 float64",
                   lambda: layer.expert_set(library, fc2=layer.fc2.astype(np.float64)))
    with layer.expert_set(library, fc1=layer.fc1.astype(np.int32),
                          fc2=layer.fc2.astype(np.int16)) as widened_set:
        checks.expect(np.array_equal(library.moe_forward(context, widened_set, EXACT, x, ids,
                                                         weights), got),
                      "expert_set_from_onnx, codes int32 / int16 in [0, 255]: the same y")


# --- Every weight format ----------------------------------------------------------------------

INT4, INT3 = libqmoe.QMOE_WEIGHT_FORMAT_INT4, libqmoe.QMOE_WEIGHT_FORMAT_INT3
MXFP4, NVFP4 = libqmoe.QMOE_WEIGHT_FORMAT_MXFP4, libqmoe.QMOE_WEIGHT_FORMAT_NVFP4
FAST = libqmoe.QMOE_ACCURACY_FAST
NVFP4_GLOBAL = float(np.float32(0.37))  # the FP32 value the struct holds


def random_codes(rng, weight_format, n, k):
    return rng.integers(0, 8 if weight_format == INT3 else 16, size=(n, k))


def random_format_scales(rng, weight_format, n, blocks, moderate=False):
    """(scale plane [n, blocks] as the library reads it, its qmoe_dtype, its FP64 values):
    FP16 for INT4 and INT3, E8M0 bytes 2^-9 .. 2^6 for MXFP4, and for NVFP4 any E4M3 byte but
    the NaNs (zero, subnormals and negatives included). moderate: E8M0 2^-9 .. 2^-4 and E4M3
    of magnitude at most 1, so that a layer's FP4 weights stay near its INT ones."""
    if weight_format in (INT4, INT3):
        plane = random_scales(rng, (n, blocks)).astype(np.float16)
        return plane, libqmoe.QMOE_DTYPE_F16, plane.astype(np.float64)
    if weight_format == MXFP4:
        plane = rng.integers(118, 124 if moderate else 134, size=(n, blocks), dtype=np.uint8)
        return plane, libqmoe.QMOE_DTYPE_E8M0, canonical_formats.e8m0_values(plane)
    magnitudes = np.arange(0x39 if moderate else 0x7F)  # 0x38 is 1, 0x7F NaN
    plane = rng.choice(np.concatenate([magnitudes, magnitudes | 0x80]), size=(n, blocks))
    plane = plane.astype(np.uint8)
    return plane, libqmoe.QMOE_DTYPE_F8_E4M3, canonical_formats.e4m3_values(plane)


def format_block(weight_format):
    return 16 if weight_format == NVFP4 else 32


def gemm_bound(x, w, accuracy):
    """Per output, docs/formats.md's bound for qmoe_gemm against y_ref = x W^T in FP64, for
    every format (the INT bounds are the FP4 ones without the 2^-23 |y_ref| output term):
      exact  1e-5 sum_k |x_k w_k| + 2^-23 |y_ref|
      fast   sum_c e_c sum_{k in c} |w_k| + 1e-5 (sum_k |x_k w_k| + that) + 2^-23 |y_ref|,
             e_c = s_c / 2 with s_c = max|x| / 127 over the 32 k of chunk c, rounded to FP32.
    Returns (y_ref, bound)."""
    x64 = x.astype(np.float64)
    want = x64 @ w.T
    magnitude = np.abs(x64) @ np.abs(w).T
    extra = np.zeros_like(want)
    if accuracy == FAST:
        k = x.shape[1]
        for start in range(0, k, 32):
            amax = np.abs(x[:, start:start + 32]).max(axis=1).astype(np.float32)
            step = (amax / np.float32(127.0)).astype(np.float64)
            e = np.where(amax < np.float32(2.0**-119), amax.astype(np.float64), step / 2)
            extra += e[:, None] * np.abs(w[:, start:start + 32]).sum(axis=1)[None, :]
    bound = extra + 1e-5 * (magnitude + extra) + 2.0**-23 * np.abs(want) + 1e-30
    return want, bound


def check_gemm_against_reference(library, checks, context, rng, what, matrix, w):
    """qmoe_gemm at both levels, M = 1 (GEMV) and M = 3, into guarded y, within gemm_bound
    of the FP64 product with the reference's W; y finite (a NaN from a scale guard fails)."""
    n, k = w.shape
    for m in (1, 3):
        x = rng.uniform(-1.0, 1.0, size=(m, k)).astype(np.float32)
        for accuracy in (EXACT, FAST):
            want, bound = gemm_bound(x, w, accuracy)
            y = Guarded((m, n), np.float32)
            got = library.gemm(context, matrix, accuracy, x, y.payload)
            error = np.abs(got.astype(np.float64) - want)
            worst = float((error / bound).max()) if np.isfinite(got).all() else float("inf")
            checks.expect(np.shares_memory(got, y.payload) and worst <= 1.0 and
                          y.guards_intact(),
                          f"qmoe_gemm {what}, {libqmoe.ACCURACY_NAMES[accuracy]}, M = {m}: "
                          f"worst error / bound {worst:.2g} (<= 1) against FP64 from the "
                          "decoded codes, y's guards intact")


def check_format_reference(checks):
    """The NumPy reference itself against docs/formats.md's worked examples."""
    failures = canonical_formats.check_against_the_docs()
    for failure in failures:
        checks.expect(False, f"tests/python/canonical_formats.py: {failure}")
    checks.expect(not failures, "canonical_formats.py encodes and decodes docs/formats.md's "
                  "examples byte for byte")


def check_format_gemv(library, checks, context, rng):
    """Library.matrix for every format, scale planes in place ([N, K/block]) and grouped,
    between NaN guards (all-ones bytes are NaN in every scale type); N = 20 has a partial
    row group and NVFP4's K = 48 a half-filled last chunk."""
    cases = ((INT4, 20, 64, "grouped"), (INT3, 20, 64, "plain"), (INT3, 20, 96, "grouped"),
             (MXFP4, 20, 96, "plain"), (MXFP4, 20, 64, "grouped"), (NVFP4, 20, 48, "grouped"),
             (NVFP4, 12, 64, "plain"))
    for weight_format, n, k, order in cases:
        name = libqmoe.WEIGHT_FORMAT_NAMES[weight_format]
        block = format_block(weight_format)
        blocks = k // block
        codes = canonical_formats.encode_codes(weight_format,
                                               random_codes(rng, weight_format, n, k))
        values_plane, scale_dtype, scale_values = random_format_scales(rng, weight_format, n,
                                                                       blocks)
        if order == "grouped":
            values_plane = canonical_formats.to_grouped(values_plane)
            strides = (1, 8, 8 * blocks)
        else:
            strides = (blocks, 1, 0)
        plane = Guarded(values_plane.shape, values_plane.dtype, fill=NAN_FILL)
        plane.payload[...] = values_plane
        global_scale = NVFP4_GLOBAL if weight_format == NVFP4 else 0.0
        matrix = library.matrix(weight_format, codes, n, k, block, plane.payload, scale_dtype,
                                *strides, global_scale=global_scale)
        w = canonical_formats.dense(weight_format, codes, n, k, block, scale_values,
                                    global_scale)
        check_gemm_against_reference(library, checks, context, rng,
                                     f"{name} {n} x {k}, scales {order}", matrix, w)
    checks.expect(library.codes_size(20, 64, INT3) == canonical_formats.canonical_size(
                  INT3, 20, 64) and library.codes_size(20, 48, NVFP4) ==
                  canonical_formats.canonical_size(NVFP4, 20, 48),
                  "codes_size of INT3 and NVFP4: 96 and 128 bytes a tile")


def check_format_importers(library, checks, context, rng):
    """Each importer on a source built from random codes: the canonical bytes equal the NumPy
    encoding of the same codes, and a product on them matches FP64."""
    n = 20
    codes = random_codes(rng, INT3, n, 64)
    want = canonical_formats.encode_int3(codes)
    out = Guarded((want.size,), np.uint8)
    got = library.import_int3_packed(canonical_formats.pack_int3_stream(codes), n, 64,
                                     out.payload)
    checks.expect(np.array_equal(got, want) and np.shares_memory(got, out.payload) and
                  out.guards_intact(), "import_int3_packed into a guarded out: the NumPy "
                  "encoding of the codes, guards intact")
    plane, dtype, values = random_format_scales(rng, INT3, n, 2)
    check_gemm_against_reference(library, checks, context, rng, "int3 from import_int3_packed",
                                 library.matrix(INT3, got, n, 64, 32, plane, dtype, 2, 1),
                                 canonical_formats.dense(INT3, want, n, 64, 32, values))

    codes = random_codes(rng, MXFP4, n, 64)
    want = canonical_formats.encode_nibbles(codes)
    blocks = canonical_formats.pack_even_low(codes).reshape(n, 2, 16)
    got = library.import_mxfp4_gpt_oss(blocks, n, 64)
    checks.expect(np.array_equal(got, want), "import_mxfp4_gpt_oss: the NumPy encoding")
    plane, dtype, values = random_format_scales(rng, MXFP4, n, 2)
    check_gemm_against_reference(library, checks, context, rng,
                                 "mxfp4 from import_mxfp4_gpt_oss",
                                 library.matrix(MXFP4, got, n, 64, 32, plane, dtype, 2, 1),
                                 canonical_formats.dense(MXFP4, want, n, 64, 32, values))

    rows = canonical_formats.ggml_mxfp4_rows(codes, plane)
    got, scales = library.import_mxfp4_ggml(rows, n, 64)
    checks.expect(np.array_equal(got, want) and np.array_equal(scales, plane),
                  "import_mxfp4_ggml: the NumPy encoding, and e as the E8M0 plane")
    check_gemm_against_reference(library, checks, context, rng, "mxfp4 from import_mxfp4_ggml",
                                 library.matrix(MXFP4, got, n, 64, 32, scales, dtype, 2, 1),
                                 canonical_formats.dense(MXFP4, want, n, 64, 32, values))

    codes = random_codes(rng, NVFP4, n, 48)
    want = canonical_formats.encode_nibbles(codes)
    got = library.import_nvfp4_modelopt(canonical_formats.pack_even_low(codes), n, 48)
    checks.expect(np.array_equal(got, want), "import_nvfp4_modelopt (K = 48): the NumPy "
                  "encoding, padding zero")
    plane, dtype, values = random_format_scales(rng, NVFP4, n, 3)
    check_gemm_against_reference(library, checks, context, rng,
                                 "nvfp4 from import_nvfp4_modelopt",
                                 library.matrix(NVFP4, got, n, 48, 16, plane, dtype, 3, 1,
                                                global_scale=NVFP4_GLOBAL),
                                 canonical_formats.dense(NVFP4, want, n, 48, 16, values,
                                                         NVFP4_GLOBAL))


def check_format_refusals(library, checks, rng):
    """A bad input per new function, refused by the wrapper before the library is called."""
    n, k = 16, 64
    codes3 = canonical_formats.encode_int3(random_codes(rng, INT3, n, k))
    codes4 = canonical_formats.encode_nibbles(random_codes(rng, MXFP4, n, k))
    f16 = random_scales(rng, (n, 2)).astype(np.float16)
    e8m0 = rng.integers(118, 134, size=(n, 2), dtype=np.uint8)
    e4m3 = np.full((n, 4), 0x38, dtype=np.uint8)
    refusals = (
        ("codes_size, weight format 9", lambda: library.codes_size(n, k, 9)),
        ("codes_size, weight format True", lambda: library.codes_size(n, k, True)),
        ("matrix, weight format 0", lambda: library.matrix(0, codes4, n, k, 32, e8m0,
                                                           libqmoe.QMOE_DTYPE_E8M0, 2, 1)),
        ("matrix, INT3 codes described as INT4 (short of INT4's codes_size)",
         lambda: library.matrix(INT4, codes3, n, k, 32, f16, libqmoe.QMOE_DTYPE_F16, 2, 1)),
        ("matrix, INT3 codes one byte short",
         lambda: library.matrix(INT3, codes3[:-1].copy(), n, k, 32, f16,
                                libqmoe.QMOE_DTYPE_F16, 2, 1)),
        ("matrix, E8M0 scales as uint16",
         lambda: library.matrix(MXFP4, codes4, n, k, 32, e8m0.astype(np.uint16),
                                libqmoe.QMOE_DTYPE_E8M0, 2, 1)),
        ("matrix, E4M3 scales [N, K/32] for NVFP4's block 16",
         lambda: library.matrix(NVFP4, codes4, n, k, 16, e4m3[:, :2].copy(),
                                libqmoe.QMOE_DTYPE_F8_E4M3, 4, 1)),
        ("matrix, global_scale 1e39 (infinite in FP32)",
         lambda: library.matrix(NVFP4, codes4, n, k, 16, e4m3, libqmoe.QMOE_DTYPE_F8_E4M3, 4,
                                1, global_scale=1e39)),
        ("matrix, global_scale 1e-50 (0, 'none', in FP32)",
         lambda: library.matrix(NVFP4, codes4, n, k, 16, e4m3, libqmoe.QMOE_DTYPE_F8_E4M3, 4,
                                1, global_scale=1e-50)),
        ("matrix, global_scale NaN",
         lambda: library.matrix(NVFP4, codes4, n, k, 16, e4m3, libqmoe.QMOE_DTYPE_F8_E4M3, 4,
                                1, global_scale=float("nan"))),
        ("matrix, global_scale '0.5'",
         lambda: library.matrix(NVFP4, codes4, n, k, 16, e4m3, libqmoe.QMOE_DTYPE_F8_E4M3, 4,
                                1, global_scale="0.5")),
        ("import_int3_packed, src one byte short",
         lambda: library.import_int3_packed(np.zeros(n * 24 - 1, dtype=np.uint8), n, k)),
        ("import_int3_packed, k 60 (not whole bytes)",
         lambda: library.import_int3_packed(np.zeros(n * 23, dtype=np.uint8), n, 60)),
        ("import_mxfp4_gpt_oss, blocks int64 holding 300",
         lambda: library.import_mxfp4_gpt_oss(np.full((n, 2, 16), 300), n, k)),
        ("import_mxfp4_gpt_oss, blocks float64",
         lambda: library.import_mxfp4_gpt_oss(np.zeros((n, 2, 16)), n, k)),
        ("import_mxfp4_ggml, src one byte short",
         lambda: library.import_mxfp4_ggml(np.zeros(n * 34 - 1, dtype=np.uint8), n, k)),
        ("import_nvfp4_modelopt, weight float32",
         lambda: library.import_nvfp4_modelopt(np.zeros((n, k // 2), np.float32), n, k)),
    )
    for what, call in refusals:
        checks.refused(what, call)
    size3 = library.codes_size(n, k, INT3)
    reversed_out = Guarded((size3,), np.uint8)
    checks.refused("import_int3_packed, out reversed",
                   lambda: library.import_int3_packed(np.zeros(n * 24, dtype=np.uint8), n, k,
                                                      reversed_out.payload[::-1]), reversed_out)
    short_out = Guarded((library.codes_size(n, k, NVFP4) - 1,), np.uint8)
    checks.refused("import_nvfp4_modelopt, out one byte short",
                   lambda: library.import_nvfp4_modelopt(np.zeros((n, k // 2), np.uint8), n, k,
                                                         short_out.payload), short_out)
    scales_out = Guarded((n, 3), np.uint8)
    checks.refused("import_mxfp4_ggml, scales [N, K/32 + 1]",
                   lambda: library.import_mxfp4_ggml(np.zeros(n * 34, dtype=np.uint8), n, k,
                                                     scales=scales_out.payload), scales_out)
    read_only = Guarded((n, 2), np.uint8, read_only=True)
    checks.refused("import_mxfp4_ggml, scales over an immutable bytes object",
                   lambda: library.import_mxfp4_ggml(np.zeros(n * 34, dtype=np.uint8), n, k,
                                                     scales=read_only.payload), read_only)
    matrix = library.matrix(MXFP4, codes4, n, k, 32, e8m0, libqmoe.QMOE_DTYPE_E8M0, 2, 1)
    checks.refused("expert_set, an fc1 entry that is a bare QuantMatrix",
                   lambda: library.expert_set([matrix.struct], [matrix]))
    checks.refused("expert_set, 2 fc1 and 1 fc2", lambda: library.expert_set([matrix] * 2,
                                                                              [matrix]))
    checks.refused("expert_set, no experts", lambda: library.expert_set([], []))


class DenseLayer:
    """What qmoe_parity.reference reads of a layer: each expert's dense FC1 and FC2 in FP64."""

    def __init__(self, fc1, fc2):
        self.fc1, self.fc2 = fc1, fc2

    def dense_fc1(self, e):
        return self.fc1[e]

    def dense_fc2(self, e):
        return self.fc2[e]


def mixed_format_set(library, rng, formats=(INT4, INT3, MXFP4, NVFP4)):
    """An ExpertSet of EXPERTS experts whose projections cycle through `formats` (expert e:
    FC1 in format e % len, FC2 in format (e + 1) % len; by default all four), from matrices
    that only the set holds once this returns; and the DenseLayer of the same weights."""
    fc1, fc2, dense1, dense2 = [], [], [], []
    for e in range(EXPERTS):
        for matrices, dense_list, weight_format, n, k in (
                (fc1, dense1, formats[e % len(formats)], 2 * INTER, HIDDEN),
                (fc2, dense2, formats[(e + 1) % len(formats)], HIDDEN, INTER)):
            block = format_block(weight_format)
            codes = canonical_formats.encode_codes(weight_format,
                                                   random_codes(rng, weight_format, n, k))
            plane, dtype, values = random_format_scales(rng, weight_format, n, k // block,
                                                        moderate=True)
            global_scale = NVFP4_GLOBAL if weight_format == NVFP4 else 0.0
            matrices.append(library.matrix(weight_format, codes, n, k, block, plane, dtype,
                                           k // block, 1, global_scale=global_scale))
            dense_list.append(canonical_formats.dense(weight_format, codes, n, k, block, values,
                                                      global_scale))
    alpha, beta, limit = QWEN3_SWIGLU
    return (library.expert_set(fc1, fc2, alpha=alpha, beta=beta, limit=limit),
            DenseLayer(dense1, dense2))


def check_format_experts(library, checks, context, rng):
    """Library.expert_set from matrices of all four formats in one set, against
    qmoe_parity's FP64 layer reference (its bounds are INT4's; FP4's extra 2^-23 |y_ref| per
    GEMM is at most 1.2% of the 1e-5 sum |x w| term, so the bound is widened by 2%), after a
    collection that would free weights the set did not keep."""
    expert_set, layer = mixed_format_set(library, rng)
    for _ in range(3):
        gc.collect()
        scratch = [np.full(4096, 1e30, dtype=np.float32) for _ in range(64)]
    del scratch
    m = 4
    x = rng.uniform(-1.0, 1.0, size=(m, HIDDEN)).astype(np.float32)
    logits = qmoe_parity.draw_logits(rng, m, EXPERTS, TOP_K)
    with expert_set:
        checks.expect(expert_set.num_experts == EXPERTS and expert_set.hidden == HIDDEN,
                      "expert_set: E and H from the matrices")
        ids, weights = library.route_topk(logits, TOP_K)
        for accuracy, model in ((EXACT, "fp32"), (FAST, "qmoe_fast")):
            y = Guarded((m, HIDDEN), np.float32)
            got = library.moe_forward(context, expert_set, accuracy, x, ids, weights, y.payload)
            ref = qmoe_parity.reference(layer, QWEN3_SWIGLU, x, logits, TOP_K, model)
            ratio = qmoe_parity.worst_ratio(got, ref.y, 1.02 * ref.tol)
            checks.expect(ratio <= 1.0 and y.guards_intact(),
                          f"qmoe_moe_forward, {libqmoe.ACCURACY_NAMES[accuracy]}, experts in "
                          f"all four formats: worst error / bound {ratio:.2g} (<= 1)")


def library_refuses(checks, what, call, status_name):
    """`call` must reach the library and fail with `status_name` (QmoeError)."""
    try:
        call()
    except libqmoe.QmoeError as error:
        checks.expect(error.status_name == status_name,
                      f"{what}: refused with {error.status_name} ({status_name} expected)")
        return
    checks.expect(False, f"{what}: accepted")


def check_store(library, checks, context, rng):
    """Library.write_expert_store / open_expert_store: an NVFP4 layer (global scales) written,
    read back whole and run to the bits of the set written; records read by id; a set of mixed
    formats, a missing file and bad arguments refused."""
    mixed, _ = mixed_format_set(library, rng)
    uniform, _ = mixed_format_set(library, rng, formats=(NVFP4,))
    fd, path = tempfile.mkstemp(suffix=".qmoe")
    os.close(fd)
    try:
        with mixed:
            library_refuses(checks, "write_expert_store: experts of four formats in one layer",
                            lambda: library.write_expert_store(path, [mixed]),
                            "QMOE_STATUS_INVALID_ARGUMENT")
        checks.refused("write_expert_store: no layers",
                       lambda: library.write_expert_store(path, []))
        with uniform:
            library.write_expert_store(path, [uniform, uniform])
            with library.open_expert_store(path) as store:
                info = store.info
                checks.expect(info["num_layers"] == 2 and info["num_experts"] == EXPERTS and
                              info["hidden"] == HIDDEN and info["fc1_format"] == NVFP4 and
                              info["file_bytes"] == os.path.getsize(path),
                              f"open_expert_store: info {info}")
                records = store.read(1, [2, 0])
                header = records.view(np.uint32)
                step = info["expert_bytes"] // 4
                checks.expect(bytes(records[:4]) == b"QREC" and header[1] == 1 and
                              header[2] == 2 and header[step + 2] == 0,
                              "ExpertStore.read: the records of experts 2 and 0 of layer 1")
                loaded = store.load_layer(1)
                m = 3
                x = rng.uniform(-1.0, 1.0, size=(m, HIDDEN)).astype(np.float32)
                ids, weights = library.route_topk(
                    qmoe_parity.draw_logits(rng, m, EXPERTS, TOP_K), TOP_K)
                with loaded:
                    for accuracy in (EXACT, FAST):
                        want = library.moe_forward(context, uniform, accuracy, x, ids, weights)
                        got = library.moe_forward(context, loaded, accuracy, x, ids, weights)
                        checks.expect(np.array_equal(want.view(np.uint32), got.view(np.uint32)),
                                      f"load_layer, {libqmoe.ACCURACY_NAMES[accuracy]}: the "
                                      "bits of the set written")
                mapped = store.map_layer(1)
                store.prefetch(1, [3, 1])
                checks.expect(store.ready(1, np.arange(EXPERTS)).shape == (EXPERTS,),
                              "ExpertStore.ready: one answer an expert")
                checks.refused("ExpertStore.ready: an id of E", lambda: store.ready(1, [EXPERTS]))
                checks.refused("ExpertStore.map_layer: layer 2 of 2", lambda: store.map_layer(2))
                checks.refused("ExpertStore.read: layer 2 of 2", lambda: store.read(2, [0]))
                checks.refused("ExpertStore.read: an id of E", lambda: store.read(0, [EXPERTS]))
                checks.refused("ExpertStore.read: fractional ids", lambda: store.read(0, [0.5]))
            library_refuses(checks, "ExpertStore.read: a closed store",
                            lambda: store.read(0, [0]), "QMOE_STATUS_INVALID_ARGUMENT")
            with mapped:  # after close: the set keeps the mapping
                for accuracy in (EXACT, FAST):
                    want = library.moe_forward(context, uniform, accuracy, x, ids, weights)
                    got = library.moe_forward(context, mapped, accuracy, x, ids, weights)
                    checks.expect(np.array_equal(want.view(np.uint32), got.view(np.uint32)),
                                  f"map_layer after close, {libqmoe.ACCURACY_NAMES[accuracy]}: "
                                  "the bits of the set written")
        with open(path, "r+b") as f:
            f.truncate(os.path.getsize(path) - 1)
        library_refuses(checks, "open_expert_store: a truncated file",
                        lambda: library.open_expert_store(path), "QMOE_STATUS_CORRUPT_DATA")
    finally:
        os.remove(path)
    library_refuses(checks, "open_expert_store: a missing file",
                    lambda: library.open_expert_store(path), "QMOE_STATUS_IO_ERROR")


def check_cache(library, checks):
    """Library.expert_cache: LRU over hand-worked steps (the C++ test's), the counters, and
    bad arguments refused by the wrapper (ValueError) or the library (QmoeError)."""
    with library.expert_cache(1, 4, 2, policy="lru") as cache:
        got = []
        for ids in ([0, 1], [2], [1, 1, 3], [1]):
            cache.observe(0, np.array(ids))
            cache.end_step()
            got.append(cache.residency(0).tolist())
        checks.expect(got == [[0, 1], [0, 2], [1, 3], [1, 3]],
                      f"expert_cache: LRU residency step by step {got}")
        stats = cache.stats()
        checks.expect(stats == {"steps": 4, "selections": 7, "hits": 1, "promotions": 5,
                                "evictions": 3} and cache.stats(0) == stats,
                      f"expert_cache: counters {stats}")
        cache.observe_counts(0, [0, 2, 0, 0])  # expert 1 twice: a hit each
        checks.expect(cache.stats()["hits"] == 3, "expert_cache: observe_counts counts hits")
        checks.refused("expert_cache: counts for 3 of 4 experts",
                       lambda: cache.observe_counts(0, [1, 1, 1]))
        cache.end_step()
        cache.set_residency(0, [3])
        checks.expect(cache.residency(0).tolist() == [3], "expert_cache: set_residency")
        checks.refused("expert_cache: an id of 4 among 4 experts",
                       lambda: cache.observe(0, np.array([1, 4])))
        checks.refused("expert_cache: layer 1 of 1", lambda: cache.observe(1, np.array([0])))
        checks.refused("expert_cache: three experts for two slots",
                       lambda: cache.set_residency(0, [0, 1, 2]))
        checks.refused("expert_cache: fractional ids", lambda: cache.observe(0, [0.5]))
        try:
            cache.set_residency(0, [2, 2])
            checks.expect(False, "expert_cache: an expert placed twice is refused")
        except libqmoe.QmoeError as error:
            checks.expect(error.status_name == "QMOE_STATUS_INVALID_ARGUMENT",
                          f"expert_cache: an expert placed twice is refused ({error})")
    # The admission margin reaches the library: LFU with a margin of 2 keeps expert 0 (one
    # selection) until expert 1 has four (the C++ test's steps).
    with library.expert_cache(1, 3, 1, policy="lfu", admission_margin=2.0) as cache:
        got = []
        for ids in ([0], [1], [1], [1], [1]):
            cache.observe(0, np.array(ids))
            cache.end_step()
            got.append(cache.residency(0).tolist())
        checks.expect(got == [[0], [0], [0], [0], [1]],
                      f"expert_cache: LFU with an admission margin of 2 {got}")
    try:
        library.expert_cache(1, 4, 2, admission_margin=-1.0)
        checks.expect(False, "expert_cache: a negative admission margin is refused")
    except libqmoe.QmoeError as error:
        checks.expect("admission_margin" in error.message,
                      f"expert_cache: a negative admission margin is refused ({error})")
    checks.refused("expert_cache: an unknown policy",
                   lambda: library.expert_cache(1, 4, 2, policy="mru"))
    try:
        library.expert_cache(1, 4, 5)
        checks.expect(False, "expert_cache: more slots than experts is refused")
    except libqmoe.QmoeError as error:
        checks.expect("num_slots" in error.message,
                      f"expert_cache: more slots than experts is refused ({error})")


def main():
    if len(sys.argv) != 2:
        sys.exit(__doc__.split("Usage: ")[1].split("\n")[0])
    library = libqmoe.Library(sys.argv[1])
    print(f"numpy {np.__version__}, libqmoe {library.version()} ({sys.argv[1]})")
    checks = Checks()
    rng = np.random.default_rng(20260419)
    with library.context(2) as context:
        for group in (lambda: check_codes_out(library, checks, rng),
                      lambda: check_scales(library, checks, context, rng),
                      lambda: check_moe(library, checks, context, rng),
                      lambda: check_integer_arguments(library, checks, context, rng),
                      lambda: check_parity_logits(checks, rng),
                      lambda: check_format_reference(checks),
                      lambda: check_format_gemv(library, checks, context, rng),
                      lambda: check_format_importers(library, checks, context, rng),
                      lambda: check_format_refusals(library, checks, rng),
                      lambda: check_format_experts(library, checks, context, rng),
                      lambda: check_cache(library, checks),
                      lambda: check_store(library, checks, context, rng)):
            # A valid form that raises is a failure too; the other groups still run.
            try:
                group()
            except Exception as error:  # noqa: BLE001
                traceback.print_exc()
                checks.failures.append(f"a valid call raised {type(error).__name__}: {error}")

    if checks.failures:
        print(f"FAIL: {len(checks.failures)} check(s) failed:")
        for failure in checks.failures:
            print(f"  {failure}")
        return 1
    print("PASS: libqmoe.py refuses the unsafe arguments and accepts the valid ones")
    return 0


if __name__ == "__main__":
    sys.exit(main())
