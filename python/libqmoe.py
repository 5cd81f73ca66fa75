"""ctypes binding of the parts of libqmoe's C ABI (include/qmoe/qmoe.h) that the Python
benchmarks and tests use.

Why: the comparisons against ONNX Runtime (benchmarks/compare_onnxruntime*.py) and the parity
test (tests/python/onnxruntime_qmoe_test.py) call the shared library from Python, in the same process
as onnxruntime, so that both sides see the same bytes. One binding keeps the struct layouts in
one place; they mirror qmoe.h field by field (enums are C ints, option structs start with
struct_size), and every struct the library has an *_init function for is checked at load
time: the size the library writes into struct_size must equal ctypes.sizeof of the mirror.

What: Library(path) loads libqmoe and offers contexts (with num_threads); quant matrices of
every weight format (INT4, INT3, MXFP4, NVFP4) from canonical codes and a scale plane
(Library.matrix), and the code importers (ONNX Runtime INT4, packed INT3, gpt-oss and ggml
MXFP4, ModelOpt NVFP4); qmoe_gemm; expert sets built from such matrices (Library.expert_set)
or from ONNX Runtime QMoE-layout INT4 weights; routing, qmoe_moe_forward and qmoe_moe_forward
on logits; the expert cache's policy (qmoe_cache.h: Library.expert_cache); expert store files
(qmoe_store.h: Library.write_expert_store, Library.open_expert_store, whose ExpertStore reads
records, loads or maps a layer's ExpertSet, prefetches and tells ready experts). A failing
call
raises QmoeError with the status name and qmoe_last_error_message(). Library.lib is the raw
CDLL (argtypes set) for timing loops that want one bare ctypes call per iteration.
"""

import ctypes
import math
import os
import weakref

import numpy as np

# Enum values of qmoe.h (fixed forever by the ABI).
QMOE_STATUS_OK = 0
QMOE_ISA_DEFAULT = 0
QMOE_WEIGHT_FORMAT_INT4 = 1
QMOE_WEIGHT_FORMAT_INT3 = 2
QMOE_WEIGHT_FORMAT_MXFP4 = 3
QMOE_WEIGHT_FORMAT_NVFP4 = 4
QMOE_DTYPE_F32 = 1
QMOE_DTYPE_F16 = 2
QMOE_DTYPE_BF16 = 3
QMOE_DTYPE_E8M0 = 4      # scales only: uint8 e, 2^(e - 127)
QMOE_DTYPE_F8_E4M3 = 5   # scales only: OCP FP8 E4M3 bits in uint8
QMOE_ACCURACY_EXACT = 1
QMOE_ACCURACY_FAST = 2
QMOE_SWIGLU_INTERLEAVED = 1
QMOE_SWIGLU_CONCATENATED = 2
# qmoe_cache.h
QMOE_CACHE_POLICY_STATIC = 1
QMOE_CACHE_POLICY_LRU = 2
QMOE_CACHE_POLICY_LFU = 3
QMOE_CACHE_POLICY_LFRU = 4
QMOE_EXPERT_CACHE_ALL_LAYERS = 0xFFFFFFFF
CACHE_POLICIES = {"static": QMOE_CACHE_POLICY_STATIC, "lru": QMOE_CACHE_POLICY_LRU,
                  "lfu": QMOE_CACHE_POLICY_LFU, "lfru": QMOE_CACHE_POLICY_LFRU}

ACCURACY_NAMES = {QMOE_ACCURACY_EXACT: "exact", QMOE_ACCURACY_FAST: "fast"}
WEIGHT_FORMAT_NAMES = {QMOE_WEIGHT_FORMAT_INT4: "int4", QMOE_WEIGHT_FORMAT_INT3: "int3",
                       QMOE_WEIGHT_FORMAT_MXFP4: "mxfp4", QMOE_WEIGHT_FORMAT_NVFP4: "nvfp4"}
_QMOE_DTYPE_NAMES = {QMOE_DTYPE_F32: "QMOE_DTYPE_F32", QMOE_DTYPE_F16: "QMOE_DTYPE_F16",
                     QMOE_DTYPE_BF16: "QMOE_DTYPE_BF16", QMOE_DTYPE_E8M0: "QMOE_DTYPE_E8M0",
                     QMOE_DTYPE_F8_E4M3: "QMOE_DTYPE_F8_E4M3"}


class ContextOptions(ctypes.Structure):
    """qmoe_context_options."""
    _fields_ = [
        ("struct_size", ctypes.c_size_t),
        ("max_isa", ctypes.c_int),
        ("num_threads", ctypes.c_uint32),
        ("parallel_for", ctypes.c_void_p),
        ("parallel_for_state", ctypes.c_void_p),
    ]


class QuantMatrix(ctypes.Structure):
    """qmoe_quant_matrix."""
    _fields_ = [
        ("struct_size", ctypes.c_size_t),
        ("format", ctypes.c_int),
        ("n", ctypes.c_uint32),
        ("k", ctypes.c_uint32),
        ("block_size", ctypes.c_uint32),
        ("codes", ctypes.c_void_p),
        ("scale_dtype", ctypes.c_int),
        ("scales", ctypes.c_void_p),
        ("scale_row_stride", ctypes.c_size_t),
        ("scale_block_stride", ctypes.c_size_t),
        ("zero_points", ctypes.c_void_p),
        ("zero_point_row_stride", ctypes.c_size_t),
        ("zero_point_block_stride", ctypes.c_size_t),
        ("bias_dtype", ctypes.c_int),
        ("bias", ctypes.c_void_p),
        ("scale_group_stride", ctypes.c_size_t),
        ("zero_point_group_stride", ctypes.c_size_t),
        ("global_scale", ctypes.c_float),
    ]


class ExpertSetDesc(ctypes.Structure):
    """qmoe_expert_set_desc."""
    _fields_ = [
        ("struct_size", ctypes.c_size_t),
        ("num_experts", ctypes.c_uint32),
        ("hidden", ctypes.c_uint32),
        ("intermediate", ctypes.c_uint32),
        ("swiglu_fusion", ctypes.c_int),
        ("fc1", ctypes.POINTER(ctypes.POINTER(QuantMatrix))),
        ("fc2", ctypes.POINTER(ctypes.POINTER(QuantMatrix))),
        ("swiglu_alpha", ctypes.c_float),
        ("swiglu_beta", ctypes.c_float),
        ("swiglu_limit", ctypes.c_float),
    ]


class ExpertCacheDesc(ctypes.Structure):
    """qmoe_expert_cache_desc."""
    _fields_ = [
        ("struct_size", ctypes.c_size_t),
        ("num_layers", ctypes.c_uint32),
        ("num_experts", ctypes.c_uint32),
        ("num_slots", ctypes.c_uint32),
        ("policy", ctypes.c_int),
        ("half_life_steps", ctypes.c_float),
        ("max_promotions_per_step", ctypes.c_uint32),
        ("admission_margin", ctypes.c_float),
    ]


class ExpertCacheStats(ctypes.Structure):
    """qmoe_expert_cache_stats."""
    _fields_ = [
        ("struct_size", ctypes.c_size_t),
        ("steps", ctypes.c_uint64),
        ("selections", ctypes.c_uint64),
        ("hits", ctypes.c_uint64),
        ("promotions", ctypes.c_uint64),
        ("evictions", ctypes.c_uint64),
    ]


class ExpertStoreInfo(ctypes.Structure):
    """qmoe_expert_store_info."""
    _fields_ = [
        ("struct_size", ctypes.c_size_t),
        ("num_layers", ctypes.c_uint32),
        ("num_experts", ctypes.c_uint32),
        ("hidden", ctypes.c_uint32),
        ("intermediate", ctypes.c_uint32),
        ("fc1_format", ctypes.c_int),
        ("fc2_format", ctypes.c_int),
        ("expert_bytes", ctypes.c_size_t),
        ("file_bytes", ctypes.c_uint64),
    ]


class MoeParams(ctypes.Structure):
    """qmoe_moe_params."""
    _fields_ = [
        ("struct_size", ctypes.c_size_t),
        ("accuracy", ctypes.c_int),
        ("m", ctypes.c_uint32),
        ("dtype", ctypes.c_int),
        ("x", ctypes.c_void_p),
        ("ldx", ctypes.c_size_t),
        ("y", ctypes.c_void_p),
        ("ldy", ctypes.c_size_t),
        ("k", ctypes.c_uint32),
        ("ids", ctypes.c_void_p),
        ("weights", ctypes.c_void_p),
        ("logits", ctypes.c_void_p),
        ("renormalize", ctypes.c_int),
        ("run_mask", ctypes.c_void_p),
        ("accumulate", ctypes.c_int),
        ("workspace", ctypes.c_void_p),
        ("workspace_bytes", ctypes.c_size_t),
    ]


class QmoeError(RuntimeError):
    """A libqmoe call returned a status other than QMOE_STATUS_OK."""

    def __init__(self, what, status, status_name, message):
        super().__init__(f"{what}: {status_name} ({status}): {message}")
        self.status = status
        self.status_name = status_name
        self.message = message


def aligned_empty(nbytes, dtype=np.uint8, alignment=64):
    """An uninitialised numpy array of nbytes bytes whose data starts on `alignment`."""
    raw = np.empty(nbytes + alignment, dtype=np.uint8)
    offset = (-raw.ctypes.data) % alignment
    return raw[offset:offset + nbytes].view(dtype)


def _checked_array(a, dtype, shape, name, writeable=False):
    """`a` itself, if it is a C-contiguous array of `dtype` and `shape` (None: any shape), and
    writeable when `writeable` (an output: the library writes it in place, so nothing is
    converted or copied, and a read-only array, e.g. np.frombuffer over a bytes object, would
    have its immutable memory overwritten); ValueError otherwise."""
    a = np.asarray(a)
    if (a.dtype != dtype or not a.flags.c_contiguous
            or (shape is not None and a.shape != shape)):
        described = f" of shape {shape}" if shape is not None else ""
        raise ValueError(f"{name} must be C-contiguous {np.dtype(dtype).name}{described}, "
                         f"got {a.dtype} {a.shape}"
                         + ("" if a.flags.c_contiguous else " (not C-contiguous)"))
    if writeable and not a.flags.writeable:
        raise ValueError(f"{name} is an output and must be writeable, got a read-only array")
    return a


def _exact_integer_array(a, dtype, name):
    """`a` as a C-contiguous array of the integer `dtype` the library reads, with every value
    unchanged: `a` itself when it already is one, a converted copy when it is an integer array
    of another width whose values all fit; TypeError for a non-integer array and ValueError for
    a value out of range. Why: np.asarray(a, dtype) casts unsafely and silently, so int64
    2**32 + 1 became int32 1, float 1.9 became 1, and int64 300 became uint8 44."""
    a = np.asarray(a)
    dtype = np.dtype(dtype)
    if a.dtype == dtype:
        return np.ascontiguousarray(a)
    if a.dtype.kind not in "iu":  # bool, float, complex, object...: no lossless cast
        raise TypeError(f"{name} must be an integer array ({dtype.name}), got {a.dtype}")
    if a.size:
        info = np.iinfo(dtype)
        # Python ints: comparisons of uint64 and int64 extremes stay exact.
        low, high = int(a.min()), int(a.max())
        if low < info.min or high > info.max:
            raise ValueError(f"{name} must hold {dtype.name} values [{info.min}, {info.max}], "
                             f"got values in [{low}, {high}] ({a.dtype})")
    return np.ascontiguousarray(a, dtype=dtype)


# The numpy dtype a scale plane of each qmoe_dtype must have. numpy has no bfloat16 and no
# 8-bit floats: BF16 planes are their raw bits, uint16, and E8M0 and E4M3 planes uint8.
_SCALE_NUMPY_DTYPES = {
    QMOE_DTYPE_F32: np.dtype(np.float32),
    QMOE_DTYPE_F16: np.dtype(np.float16),
    QMOE_DTYPE_BF16: np.dtype(np.uint16),
    QMOE_DTYPE_E8M0: np.dtype(np.uint8),
    QMOE_DTYPE_F8_E4M3: np.dtype(np.uint8),
}


def _checked_scale_plane(scales, scale_dtype, n, k, block_size, row_stride, block_stride,
                         group_stride):
    """`scales` itself, if it is a C-contiguous array of `scale_dtype`'s numpy type holding
    every element the library reads at these strides (qmoe.h: element (r, b) at
    r * row_stride + b * block_stride, or with a nonzero group stride
    (r / 8) * group_stride + (r % 8) * row_stride + b * block_stride, r < n, b < k / block_size);
    TypeError or ValueError otherwise. Why: the library reads the plane through a bare pointer,
    so a float16 array described as F32, or strides beyond the array, read past its end."""
    scales = np.asarray(scales)
    want = _SCALE_NUMPY_DTYPES.get(scale_dtype)
    if want is None:
        raise ValueError(f"scale_dtype must be QMOE_DTYPE_F32, _F16, _BF16, _E8M0 or _F8_E4M3, "
                         f"got {scale_dtype}")
    if scales.dtype != want:
        raise TypeError(f"scales described as {_QMOE_DTYPE_NAMES[scale_dtype]} must be "
                        f"{want.name}, got {scales.dtype}")
    if not scales.flags.c_contiguous:
        raise ValueError("scales must be C-contiguous (the library reads them in place)")
    # Ceiling: a k that is not a multiple of block_size is refused by the library, but the
    # extent checked here must not be smaller than any block it might address.
    blocks = -(-k // block_size) if block_size > 0 else 0
    if n > 0 and blocks > 0:
        last = n - 1
        if group_stride:
            # Within a group of 8 rows the term grows with r % 8, so the largest is at the last
            # row or at the last row of the group before it (a full group).
            rows = [last] + ([8 * (last // 8) - 1] if last >= 8 else [])
            row_term = max((r // 8) * group_stride + (r % 8) * row_stride for r in rows)
        else:
            row_term = last * row_stride
        needed = row_term + (blocks - 1) * block_stride + 1
        if scales.size < needed:
            raise ValueError(f"scales hold {scales.size} elements; an [{n}, {blocks}] plane at "
                             f"row stride {row_stride}, block stride {block_stride}, group "
                             f"stride {group_stride} reads up to element {needed - 1}")
    return scales


def _c_integer(value, name, low, high, c_type):
    """`value` as a Python int, if it is an integer (Python or numpy; not bool) in [low, high];
    TypeError or ValueError otherwise. Why: ctypes converts a Python int to c_uint32, c_int or
    c_size_t (arguments and struct fields alike) by silently dropping the high bits, so a
    k of 2**32 + 2 ran as k = 2, and num_threads 2**32 + 1 as 1."""
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer)):
        raise TypeError(f"{name} must be an integer ({c_type}), got {type(value).__name__} "
                        f"{value!r}")
    value = int(value)
    if not low <= value <= high:
        raise ValueError(f"{name} must be a {c_type} in [{low}, {high}], got {value}")
    return value


def _weight_format(value, name="weight_format"):
    """`value` as a Python int, if it is one of qmoe.h's qmoe_weight_format values; TypeError
    or ValueError otherwise (the wrapper sizes buffers by format, so it must know it)."""
    value = _c_integer(value, name, -2**31, 2**31 - 1, "int")
    if value not in WEIGHT_FORMAT_NAMES:
        raise ValueError(f"{name} must be a QMOE_WEIGHT_FORMAT_* value "
                         f"{sorted(WEIGHT_FORMAT_NAMES)}, got {value}")
    return value


def _global_scale(value):
    """`value` as the float32 the struct will hold, if it is a real number that FP32 holds
    finite and >= 0 (0: none), and not one FP32 rounds to 0; TypeError or ValueError
    otherwise. Why: ctypes stores a Python float in a c_float field by rounding, silently, so
    1e39 became infinity and 1e-50 became 0, which means "no global scale"."""
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, float, np.integer,
                                                                     np.floating)):
        raise TypeError(f"global_scale must be a real number, got {type(value).__name__} "
                        f"{value!r}")
    f32 = np.float32(value) if math.isfinite(float(value)) and abs(float(value)) < 2.0**128 \
        else np.float32(np.inf)
    if not np.isfinite(f32) or f32 < 0 or (f32 == 0 and value != 0):
        raise ValueError(f"global_scale must be 0 (none) or a positive value FP32 holds, got "
                         f"{value!r} (float32 {f32})")
    return float(f32)


def _u32(value, name):
    return _c_integer(value, name, 0, 2**32 - 1, "uint32_t")


def _c_int(value, name):
    return _c_integer(value, name, -2**31, 2**31 - 1, "int")


def _size(value, name):
    return _c_integer(value, name, 0, 2**(8 * ctypes.sizeof(ctypes.c_size_t)) - 1, "size_t")


def _f32_array(a, shape, name):
    return _checked_array(a, np.float32, shape, name)


def _activation_dtype(x):
    """float32 or float16: the activation types the wrappers below pass (as QMOE_DTYPE_F32
    through the plain entry points, QMOE_DTYPE_F16 through the _typed ones)."""
    dtype = np.asarray(x).dtype
    if dtype not in (np.float32, np.float16):
        raise ValueError(f"activations must be float32 or float16, got {dtype}")
    return dtype.type


_P = ctypes.c_void_p
_U32 = ctypes.c_uint32
_SZ = ctypes.c_size_t
_INT = ctypes.c_int

# name: (restype, argtypes); a restype of _INT is a qmoe_status.
_SIGNATURES = {
    "qmoe_version_string": (ctypes.c_char_p, []),
    "qmoe_status_string": (ctypes.c_char_p, [_INT]),
    "qmoe_last_error_message": (ctypes.c_char_p, []),
    "qmoe_isa_name": (ctypes.c_char_p, [_INT]),
    "qmoe_context_options_init": (None, [ctypes.POINTER(ContextOptions)]),
    "qmoe_context_create": (_INT, [ctypes.POINTER(ContextOptions), ctypes.POINTER(_P)]),
    "qmoe_context_destroy": (_INT, [_P]),
    "qmoe_context_get_isa": (_INT, [_P, ctypes.POINTER(_INT)]),
    "qmoe_context_get_num_threads": (_INT, [_P, ctypes.POINTER(_U32)]),
    "qmoe_quant_matrix_codes_size": (_INT, [_INT, _U32, _U32, ctypes.POINTER(_SZ)]),
    "qmoe_import_int4_onnx": (_INT, [_P, _U32, _U32, _P, _SZ]),
    "qmoe_import_int3_packed": (_INT, [_P, _U32, _U32, _P, _SZ]),
    "qmoe_import_mxfp4_gpt_oss": (_INT, [_P, _U32, _U32, _P, _SZ]),
    "qmoe_import_mxfp4_ggml": (_INT, [_P, _U32, _U32, _P, _SZ, _P, _SZ, _SZ]),
    "qmoe_import_nvfp4_modelopt": (_INT, [_P, _U32, _U32, _P, _SZ]),
    "qmoe_alloc_weight_memory": (_INT, [_SZ, ctypes.POINTER(_P)]),
    "qmoe_grouped_plane_elements": (_SZ, [_U32, _U32]),
    "qmoe_group_plane": (_INT, [_P, _U32, _U32, _SZ, _SZ, _SZ, _P, _SZ]),
    "qmoe_free_weight_memory": (None, [_P]),
    "qmoe_gemm": (_INT, [_P, ctypes.POINTER(QuantMatrix), _INT, _U32, _P, _SZ, _P, _SZ, _U32,
                         _U32]),
    "qmoe_expert_set_desc_init": (None, [ctypes.POINTER(ExpertSetDesc)]),
    "qmoe_expert_set_create": (_INT, [ctypes.POINTER(ExpertSetDesc), ctypes.POINTER(_P)]),
    "qmoe_expert_set_destroy": (_INT, [_P]),
    "qmoe_moe_route_topk": (_INT, [_P, _U32, _U32, _U32, _INT, _P, _P]),
    "qmoe_moe_params_init": (None, [ctypes.POINTER(MoeParams)]),
    "qmoe_moe_forward": (_INT, [_P, _P, ctypes.POINTER(MoeParams)]),
    "qmoe_expert_cache_desc_init": (None, [ctypes.POINTER(ExpertCacheDesc)]),
    "qmoe_expert_cache_create": (_INT, [ctypes.POINTER(ExpertCacheDesc), ctypes.POINTER(_P)]),
    "qmoe_expert_cache_destroy": (_INT, [_P]),
    "qmoe_expert_cache_observe": (_INT, [_P, _U32, _P, _SZ]),
    "qmoe_expert_cache_observe_counts": (_INT, [_P, _U32, _P, _U32]),
    "qmoe_expert_cache_end_step": (_INT, [_P]),
    "qmoe_expert_cache_get_residency": (_INT, [_P, _U32, _P, _U32, ctypes.POINTER(_U32)]),
    "qmoe_expert_cache_set_residency": (_INT, [_P, _U32, _P, _U32]),
    "qmoe_expert_cache_get_stats": (_INT, [_P, _U32, ctypes.POINTER(ExpertCacheStats)]),
    "qmoe_expert_store_write": (_INT, [ctypes.c_char_p, _P, _U32]),
    "qmoe_expert_store_open": (_INT, [ctypes.c_char_p, ctypes.POINTER(_P)]),
    "qmoe_expert_store_close": (_INT, [_P]),
    "qmoe_expert_store_get_info": (_INT, [_P, ctypes.POINTER(ExpertStoreInfo)]),
    "qmoe_expert_store_read": (_INT, [_P, _U32, _P, _U32, _INT, _P, _SZ]),
    "qmoe_expert_store_create_set": (_INT, [_P, _U32, _P, ctypes.POINTER(_P)]),
    "qmoe_expert_store_map_layer": (_INT, [_P, _U32, ctypes.POINTER(_P)]),
    "qmoe_expert_store_prefetch": (_INT, [_P, _U32, _P, _U32]),
    "qmoe_expert_store_ready": (_INT, [_P, _U32, _P, _U32, _P]),
}


class Context:
    """A qmoe_context: `handle` for raw calls, `isa` (tier name) and `num_threads`."""

    def __init__(self, library, handle, isa, num_threads):
        self.library, self.handle, self.isa, self.num_threads = library, handle, isa, num_threads

    def close(self):
        if self.handle is not None:
            self.library.check(self.library.lib.qmoe_context_destroy(self.handle),
                               "qmoe_context_destroy")
            self.handle = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


class Matrix:
    """A qmoe_quant_matrix over canonical codes, and the buffers it points at.

    `ref` is byref(struct) for raw qmoe_gemm calls; `nbytes` counts codes and scales, the
    bytes a product reads.
    """

    def __init__(self, struct, buffers, nbytes):
        self.struct = struct
        self.ref = ctypes.byref(struct)
        self.buffers = buffers  # kept alive as long as the struct points at them
        self.nbytes = nbytes


class ExpertSet:
    """A qmoe_expert_set (Library.expert_set from Matrix objects of any format, or
    Library.expert_set_from_onnx from ONNX Runtime QMoE-layout INT4 weights). `handle` is for
    raw calls; `nbytes` counts the canonical codes and the scales the set reads."""

    def __init__(self, library, handle, keep, nbytes, num_experts, hidden):
        self.library, self.handle, self.keep = library, handle, keep
        self.nbytes, self.num_experts, self.hidden = nbytes, num_experts, hidden

    def close(self):
        if self.handle is not None:
            self.library.check(self.library.lib.qmoe_expert_set_destroy(self.handle),
                               "qmoe_expert_set_destroy")
            self.handle = None
            self.keep = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


class ExpertCache:
    """A qmoe_expert_cache (Library.expert_cache): which experts of each layer to keep resident,
    learned from the routing it observes. Each step: observe(layer, ids) for every layer, then
    end_step(); residency(layer) is then the layer's list for the next step."""

    def __init__(self, library, handle, num_layers, num_experts, num_slots):
        self.library, self.handle = library, handle
        self.num_layers, self.num_experts, self.num_slots = num_layers, num_experts, num_slots

    def _layer(self, layer):
        layer = _u32(layer, "layer")
        if layer >= self.num_layers:
            raise ValueError(f"layer {layer} is not below the {self.num_layers} layers")
        return layer

    def observe(self, layer, ids):
        """Counts a layer's routed expert ids of this step (any shape of integers, -1 for
        padding, each in [-1, E))."""
        flat = np.ascontiguousarray(_exact_integer_array(ids, np.int32, "ids").reshape(-1))
        if flat.size and (flat.min() < -1 or flat.max() >= self.num_experts):
            raise ValueError(f"ids: each must be in [-1, {self.num_experts})")
        self.library.check(self.library.lib.qmoe_expert_cache_observe(
            self.handle, self._layer(layer), flat.ctypes.data, flat.size),
            "qmoe_expert_cache_observe")

    def observe_counts(self, layer, counts):
        """Counts a layer's per-expert selections of this step (E non-negative integers)."""
        flat = np.ascontiguousarray(_exact_integer_array(counts, np.uint32, "counts")
                                    .reshape(-1))
        if flat.size != self.num_experts:
            raise ValueError(f"counts: {flat.size} entries for {self.num_experts} experts")
        self.library.check(self.library.lib.qmoe_expert_cache_observe_counts(
            self.handle, self._layer(layer), flat.ctypes.data, flat.size),
            "qmoe_expert_cache_observe_counts")

    def end_step(self):
        self.library.check(self.library.lib.qmoe_expert_cache_end_step(self.handle),
                           "qmoe_expert_cache_end_step")

    def residency(self, layer):
        """The layer's resident experts, ascending, as a uint32 array."""
        out = np.zeros(self.num_slots, dtype=np.uint32)
        count = _U32(0)
        self.library.check(self.library.lib.qmoe_expert_cache_get_residency(
            self.handle, self._layer(layer), out.ctypes.data, self.num_slots,
            ctypes.byref(count)), "qmoe_expert_cache_get_residency")
        return out[:count.value].copy()

    def set_residency(self, layer, ids):
        """Makes `ids` (distinct, below E, at most num_slots) the layer's residents."""
        flat = np.ascontiguousarray(_exact_integer_array(ids, np.uint32, "ids").reshape(-1))
        if flat.size > self.num_slots:
            raise ValueError(f"ids: {flat.size} experts for {self.num_slots} slots")
        self.library.check(self.library.lib.qmoe_expert_cache_set_residency(
            self.handle, self._layer(layer), flat.ctypes.data, flat.size),
            "qmoe_expert_cache_set_residency")

    def stats(self, layer=None):
        """Counters of one layer, or summed over all (layer None), as a dict."""
        which = QMOE_EXPERT_CACHE_ALL_LAYERS if layer is None else self._layer(layer)
        st = ExpertCacheStats()
        st.struct_size = ctypes.sizeof(ExpertCacheStats)
        self.library.check(self.library.lib.qmoe_expert_cache_get_stats(
            self.handle, which, ctypes.byref(st)), "qmoe_expert_cache_get_stats")
        return {name: getattr(st, name) for name, _ in ExpertCacheStats._fields_[1:]}

    def close(self):
        if self.handle is not None:
            self.library.check(self.library.lib.qmoe_expert_cache_destroy(self.handle),
                               "qmoe_expert_cache_destroy")
            self.handle = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


class ExpertStore:
    """A qmoe_expert_store (Library.open_expert_store): an expert store file, open. `info` is
    a dict of its qmoe_expert_store_info fields (num_layers, num_experts, hidden,
    intermediate, fc1_format, fc2_format, expert_bytes, file_bytes)."""

    def __init__(self, library, handle, info):
        self.library, self.handle, self.info = library, handle, info

    def _layer(self, layer):
        layer = _u32(layer, "layer")
        if layer >= self.info["num_layers"]:
            raise ValueError(f"layer {layer} is not below the {self.info['num_layers']} layers")
        return layer

    def read(self, layer, ids, verify=True):
        """The records of experts `ids` of `layer`, one after another (expert_bytes each), in
        a uint8 array of weight memory (Library.weight_memory)."""
        flat = self._ids(ids)
        nbytes = max(1, flat.size * self.info["expert_bytes"])
        memory = self.library.weight_memory(nbytes)
        self.library.check(self.library.lib.qmoe_expert_store_read(
            self.handle, self._layer(layer), flat.ctypes.data, flat.size, int(bool(verify)),
            memory.ctypes.data, nbytes), "qmoe_expert_store_read")
        return memory

    def load_layer(self, layer, verify=True):
        """`layer` read whole and its ExpertSet made over the records (which the set keeps
        alive)."""
        layer = self._layer(layer)
        experts, record = self.info["num_experts"], self.info["expert_bytes"]
        memory = self.read(layer, np.arange(experts, dtype=np.uint32), verify)
        records = (_P * experts)(*[memory.ctypes.data + e * record for e in range(experts)])
        handle = _P()
        self.library.check(self.library.lib.qmoe_expert_store_create_set(
            self.handle, layer, records, ctypes.byref(handle)), "qmoe_expert_store_create_set")
        return ExpertSet(self.library, handle, [memory], experts * record, experts,
                         self.info["hidden"])

    def map_layer(self, layer):
        """`layer`'s ExpertSet over the file mapped read-only (no copy; the page cache holds
        what it can). The set keeps the mapping, also after close()."""
        handle = _P()
        self.library.check(self.library.lib.qmoe_expert_store_map_layer(
            self.handle, self._layer(layer), ctypes.byref(handle)), "qmoe_expert_store_map_layer")
        return ExpertSet(self.library, handle, None,
                         self.info["num_experts"] * self.info["expert_bytes"],
                         self.info["num_experts"], self.info["hidden"])

    def _ids(self, ids):
        flat = np.ascontiguousarray(_exact_integer_array(ids, np.uint32, "ids").reshape(-1))
        if flat.size and flat.max() >= self.info["num_experts"]:
            raise ValueError(f"ids: each must be below {self.info['num_experts']}")
        return flat

    def prefetch(self, layer, ids):
        """Asks the OS to start reading these experts of `layer` (advice; returns at once)."""
        flat = self._ids(ids)
        self.library.check(self.library.lib.qmoe_expert_store_prefetch(
            self.handle, self._layer(layer), flat.ctypes.data, flat.size),
            "qmoe_expert_store_prefetch")

    def ready(self, layer, ids):
        """A bool array: whether each expert's record is wholly in the page cache now."""
        flat = self._ids(ids)
        out = np.zeros(max(1, flat.size), dtype=np.uint8)
        self.library.check(self.library.lib.qmoe_expert_store_ready(
            self.handle, self._layer(layer), flat.ctypes.data, flat.size, out.ctypes.data),
            "qmoe_expert_store_ready")
        return out[:flat.size].astype(bool)

    def close(self):
        if self.handle is not None:
            self.library.check(self.library.lib.qmoe_expert_store_close(self.handle),
                               "qmoe_expert_store_close")
            self.handle = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


class Library:
    """libqmoe loaded from `path` (e.g. build/lib/libqmoe.so)."""

    def __init__(self, path):
        self.path = path
        self.lib = lib = ctypes.CDLL(path)
        for name, (restype, argtypes) in _SIGNATURES.items():
            function = getattr(lib, name)
            function.restype = restype
            function.argtypes = argtypes
        # The mirrors above must have the library's struct sizes.
        for struct, init in ((ContextOptions, lib.qmoe_context_options_init),
                             (ExpertSetDesc, lib.qmoe_expert_set_desc_init),
                             (MoeParams, lib.qmoe_moe_params_init),
                             (ExpertCacheDesc, lib.qmoe_expert_cache_desc_init)):
            probe = struct()
            init(ctypes.byref(probe))
            if probe.struct_size != ctypes.sizeof(struct):
                raise RuntimeError(f"{path}: {struct.__doc__} is {probe.struct_size} bytes in the "
                                   f"library, {ctypes.sizeof(struct)} in libqmoe.py")

    # --- Status ---------------------------------------------------------------------------

    def check(self, status, what):
        """Raise QmoeError unless `status` is QMOE_STATUS_OK."""
        if status != QMOE_STATUS_OK:
            raise QmoeError(what, status, self.lib.qmoe_status_string(status).decode(),
                            self.lib.qmoe_last_error_message().decode())

    def version(self):
        return self.lib.qmoe_version_string().decode()

    # --- Contexts -------------------------------------------------------------------------

    def context(self, num_threads, max_isa=QMOE_ISA_DEFAULT):
        """A Context with its own pool of `num_threads` (0: one per physical core)."""
        options = ContextOptions()
        self.lib.qmoe_context_options_init(ctypes.byref(options))
        options.max_isa = _c_int(max_isa, "max_isa")
        options.num_threads = _u32(num_threads, "num_threads")
        handle = ctypes.c_void_p()
        self.check(self.lib.qmoe_context_create(ctypes.byref(options), ctypes.byref(handle)),
                   "qmoe_context_create")
        isa = ctypes.c_int()
        count = ctypes.c_uint32()
        try:
            self.check(self.lib.qmoe_context_get_isa(handle, ctypes.byref(isa)),
                       "qmoe_context_get_isa")
            self.check(self.lib.qmoe_context_get_num_threads(handle, ctypes.byref(count)),
                       "qmoe_context_get_num_threads")
        except QmoeError:
            self.lib.qmoe_context_destroy(handle)
            raise
        return Context(self, handle, self.lib.qmoe_isa_name(isa.value).decode(), count.value)

    # --- Quantized matrices and the GEMM --------------------------------------------------

    def weight_memory(self, nbytes):
        """A uint8 numpy array of nbytes over qmoe_alloc_weight_memory (2 MiB aligned and
        advised for huge pages from 2 MiB up), freed when the array and its views are gone."""
        pointer = ctypes.c_void_p()
        self.check(self.lib.qmoe_alloc_weight_memory(nbytes, ctypes.byref(pointer)),
                   "qmoe_alloc_weight_memory")
        buffer = (ctypes.c_uint8 * nbytes).from_address(pointer.value)
        weakref.finalize(buffer, self.lib.qmoe_free_weight_memory, pointer.value)
        return np.frombuffer(buffer, dtype=np.uint8)

    def grouped_planes(self, planes):
        """Row-major [E, N, B] planes (any 1-, 2- or 4-byte dtype) in the grouped order of
        docs/formats.md, through qmoe_group_plane: [E, qmoe_grouped_plane_elements(N, B)]."""
        planes = np.ascontiguousarray(planes)
        e_count, n, blocks = planes.shape
        count = self.lib.qmoe_grouped_plane_elements(n, blocks)
        out = np.empty((e_count, count), dtype=planes.dtype)
        for e in range(e_count):
            self.check(self.lib.qmoe_group_plane(planes[e].ctypes.data, n, blocks,
                                                 planes.itemsize, blocks, 1,
                                                 out[e].ctypes.data, out[e].nbytes),
                       "qmoe_group_plane")
        return out

    def codes_size(self, n, k, weight_format=QMOE_WEIGHT_FORMAT_INT4):
        """Bytes of canonical codes of an n x k matrix of `weight_format`
        (qmoe_quant_matrix_codes_size; padding included)."""
        n, k = _u32(n, "n"), _u32(k, "k")
        weight_format = _weight_format(weight_format)
        size = ctypes.c_size_t()
        self.check(self.lib.qmoe_quant_matrix_codes_size(weight_format, n, k,
                                                         ctypes.byref(size)),
                   "qmoe_quant_matrix_codes_size")
        return size.value

    def _codes_out(self, out, size, what):
        """`out` checked as the destination of `size` canonical bytes, or a new 64-byte
        aligned array: the library writes `size` bytes from its first element, so it must be a
        writeable C-contiguous uint8 array of exactly that size (a reversed or strided view
        would be written past its end or between its elements)."""
        if out is None:
            return aligned_empty(size)
        codes = _checked_array(out, np.uint8, None, f"{what}: out", writeable=True)
        if codes.nbytes != size:
            raise ValueError(f"{what}: out has {codes.nbytes} bytes, needs {size}")
        return codes

    def _import_codes(self, function, src, src_shape, n, k, weight_format, out):
        """Canonical codes of `weight_format` from `src` (uint8, or integers that all fit in
        it; exactly prod(src_shape) of them, read as src_shape) through the importer
        `function` (name in qmoe.h), into `out` or a new array (_codes_out)."""
        src = _exact_integer_array(src, np.uint8, f"{function}: src")
        if src.size != math.prod(src_shape):
            raise ValueError(f"{function}: src has {src.size} bytes, an {n} x {k} matrix is "
                             f"{list(src_shape)} = {math.prod(src_shape)}")
        src = src.reshape(src_shape)
        size = self.codes_size(n, k, weight_format)
        codes = self._codes_out(out, size, function)
        self.check(getattr(self.lib, function)(src.ctypes.data, n, k, codes.ctypes.data, size),
                   function)
        return codes

    def import_onnx_codes(self, onnx_codes, n, k, out=None):
        """Canonical INT4 codes from ONNX Runtime's uint8 [n, k/2] rows (byte j: k = 2j in the
        low nibble, 2j + 1 in the high nibble), into `out` (uint8, codes_size(n, k) bytes) or
        a new 64-byte aligned array. onnx_codes must be uint8 (or integers that all fit in it);
        out must be a writeable C-contiguous uint8 array of exactly that size (the library
        writes `size` bytes from its first element: a reversed or strided view would be
        written past its end or between its elements)."""
        n, k = _u32(n, "n"), _u32(k, "k")
        return self._import_codes("qmoe_import_int4_onnx", onnx_codes, (n, k // 2), n, k,
                                  QMOE_WEIGHT_FORMAT_INT4, out)

    def import_int3_packed(self, packed, n, k, out=None):
        """Canonical INT3 codes from upstream runtimes' packed 3-bit rows (qmoe_import_int3_packed:
        uint8 [n, 3k/8], code k in bits 3k..3k+2 of its row, least significant bit first; k a
        multiple of 8), into `out` (uint8, codes_size(n, k, QMOE_WEIGHT_FORMAT_INT3) bytes) or
        a new array; the same checks as import_onnx_codes."""
        n, k = _u32(n, "n"), _u32(k, "k")
        if k % 8:
            raise ValueError(f"import_int3_packed: k must be a multiple of 8 (whole bytes per "
                             f"row), got {k}")
        return self._import_codes("qmoe_import_int3_packed", packed, (n, 3 * k // 8), n, k,
                                  QMOE_WEIGHT_FORMAT_INT3, out)

    def import_mxfp4_gpt_oss(self, blocks, n, k, out=None):
        """Canonical MXFP4 codes from a gpt-oss checkpoint's "<name>.blocks" tensor (uint8
        [n, k/32, 16], byte j of block b: k = 32b + 2j low, 32b + 2j + 1 high; k a multiple of
        32). Its "<name>.scales" tensor [n, k/32] is the E8M0 scale plane as it is (row stride
        k/32, block stride 1). Same checks as import_onnx_codes."""
        n, k = _u32(n, "n"), _u32(k, "k")
        if k % 32:
            raise ValueError(f"import_mxfp4_gpt_oss: k must be a multiple of 32, got {k}")
        return self._import_codes("qmoe_import_mxfp4_gpt_oss", blocks, (n, k // 32, 16), n, k,
                                  QMOE_WEIGHT_FORMAT_MXFP4, out)

    def import_nvfp4_modelopt(self, weight, n, k, out=None):
        """Canonical NVFP4 codes from a ModelOpt / TensorRT-LLM checkpoint's "weight" (uint8
        [n, k/2], even k in the low nibble; the library takes k a multiple of 16). Its E4M3
        "weight_scale" [n, k/16] is the scale plane as it is and "weight_scale_2" the global
        scale. Same checks as import_onnx_codes."""
        n, k = _u32(n, "n"), _u32(k, "k")
        if k % 2:
            raise ValueError(f"import_nvfp4_modelopt: k must be even, got {k}")
        return self._import_codes("qmoe_import_nvfp4_modelopt", weight, (n, k // 2), n, k,
                                  QMOE_WEIGHT_FORMAT_NVFP4, out)

    def import_mxfp4_ggml(self, blocks, n, k, out=None, scales=None):
        """Canonical MXFP4 codes and their E8M0 scales from ggml block_mxfp4 rows (per 32 k
        one byte e, then 16 bytes of Q4_0-ordered nibbles; n rows of k/32 blocks, 17 bytes
        each): returns (codes, scales), scales uint8 [n, k/32] (row stride k/32, block stride
        1). `out` as for import_onnx_codes; `scales`, when given, a writeable C-contiguous uint8
        array of shape (n, k/32). A block with e = 0xFF is refused by the library (QmoeError)."""
        n, k = _u32(n, "n"), _u32(k, "k")
        if k % 32:
            raise ValueError(f"import_mxfp4_ggml: k must be a multiple of 32, got {k}")
        function = "qmoe_import_mxfp4_ggml"
        src = _exact_integer_array(blocks, np.uint8, f"{function}: src")
        want = n * (k // 32) * 17
        if src.size != want:
            raise ValueError(f"{function}: src has {src.size} bytes, {n} rows of {k // 32} "
                             f"17-byte blocks are {want}")
        size = self.codes_size(n, k, QMOE_WEIGHT_FORMAT_MXFP4)
        codes = self._codes_out(out, size, function)
        if scales is None:
            scales = np.zeros((n, k // 32), dtype=np.uint8)
        scales = _checked_array(scales, np.uint8, (n, k // 32), f"{function}: scales",
                                writeable=True)
        self.check(self.lib.qmoe_import_mxfp4_ggml(src.ctypes.data, n, k, codes.ctypes.data,
                                                   size, scales.ctypes.data, k // 32, 1),
                   function)
        return codes, scales

    def describe_matrix(self, codes, n, k, block_size, scales, scale_dtype, scale_row_stride,
                        scale_block_stride, scale_group_stride=0,
                        weight_format=QMOE_WEIGHT_FORMAT_INT4, global_scale=0.0):
        """A QuantMatrix struct of `weight_format` over canonical `codes` and a scale plane at
        the given strides (group stride 0: the plain plane; no zero points: the format's
        default; no bias; global_scale 0: none). The caller keeps `codes` and `scales` alive.
        codes must be C-contiguous uint8 of at least codes_size(n, k, weight_format) bytes;
        scales C-contiguous of scale_dtype's numpy type (F32 float32, F16 float16, BF16 uint16
        bits, E8M0 and F8_E4M3 uint8) and holding every element the strides address (both
        checked: the struct is only pointers, and the library reads whatever lies there).
        Which block sizes, scale types and global scales a format takes is the library's to
        say: qmoe_gemm and qmoe_expert_set_create refuse the others (QmoeError)."""
        n, k, block_size = _u32(n, "n"), _u32(k, "k"), _u32(block_size, "block_size")
        weight_format = _weight_format(weight_format)
        global_scale = _global_scale(global_scale)
        scale_row_stride = _size(scale_row_stride, "scale_row_stride")
        scale_block_stride = _size(scale_block_stride, "scale_block_stride")
        scale_group_stride = _size(scale_group_stride, "scale_group_stride")
        codes = _checked_array(codes, np.uint8, None, "codes")
        try:
            needed = self.codes_size(n, k, weight_format)
        except QmoeError:
            needed = 0  # a shape the library refuses: every call with this struct fails first
        if codes.nbytes < needed:
            raise ValueError(f"codes hold {codes.nbytes} bytes; an {n} x {k} "
                             f"{WEIGHT_FORMAT_NAMES[weight_format]} matrix is {needed} "
                             "(codes_size)")
        scales = _checked_scale_plane(scales, scale_dtype, n, k, block_size, scale_row_stride,
                                      scale_block_stride, scale_group_stride)
        w = QuantMatrix()
        w.struct_size = ctypes.sizeof(QuantMatrix)
        w.format = weight_format
        w.n, w.k, w.block_size = n, k, block_size
        w.codes = codes.ctypes.data
        w.scale_dtype = scale_dtype
        w.scales = scales.ctypes.data
        w.scale_row_stride, w.scale_block_stride = scale_row_stride, scale_block_stride
        w.scale_group_stride = scale_group_stride
        w.global_scale = global_scale
        return w

    def matrix(self, weight_format, codes, n, k, block_size, scales, scale_dtype,
               scale_row_stride, scale_block_stride, scale_group_stride=0, global_scale=0.0):
        """A Matrix of any format over canonical `codes` (from an importer, or written in the
        layout of docs/formats.md) and a scale plane used in place at the given strides:
          INT4, INT3  scales F32 / F16 / BF16 per 16, 32, 64 or 128 k (zero points: 8 and 4);
          MXFP4       E8M0 scales (uint8) per 32;
          NVFP4       E4M3 scales (uint8) per 16, and global_scale (> 0; 0 means 1).
        ([N, K/block] is (K/block, 1), the grouped order (1, 8, 8 * K/block).) The arrays are
        checked as describe_matrix says and kept alive by the Matrix."""
        struct = self.describe_matrix(codes, n, k, block_size, scales, scale_dtype,
                                      scale_row_stride, scale_block_stride, scale_group_stride,
                                      weight_format, global_scale)
        codes, scales = np.asarray(codes), np.asarray(scales)
        return Matrix(struct, (codes, scales), codes.nbytes + scales.nbytes)

    def import_onnx_matrix(self, onnx_codes, n, k, block_size, scales, scale_dtype,
                           scale_row_stride, scale_block_stride):
        """A Matrix from ONNX Runtime's INT4 codes and a scale plane used in place:
        scales[n * scale_row_stride + b * scale_block_stride] (FP32 [n, k/block] as ORT reads
        it is (k / block_size, 1)). The scales' numpy type must be scale_dtype's (float32,
        float16, or uint16 bits for BF16), and they must hold every element the strides
        address; both are checked before anything is imported."""
        scales = np.ascontiguousarray(scales)
        _checked_scale_plane(scales, scale_dtype, n, k, block_size, scale_row_stride,
                             scale_block_stride, 0)
        codes = self.import_onnx_codes(onnx_codes, n, k)
        struct = self.describe_matrix(codes, n, k, block_size, scales, scale_dtype,
                                      scale_row_stride, scale_block_stride)
        return Matrix(struct, (codes, scales), codes.nbytes + scales.nbytes)

    def gemm(self, context, matrix, accuracy, x, y=None):
        """y[m, :] = W x[m, :] for every row of float32 x [m, k]; returns y [m, n]."""
        m = _u32(np.shape(x)[0], "m (rows of x)")
        accuracy = _c_int(accuracy, "accuracy")
        n, k = matrix.struct.n, matrix.struct.k
        x = _f32_array(x, (m, k), "x")
        if y is None:
            y = np.zeros((m, n), dtype=np.float32)
        y = _checked_array(y, np.float32, (m, n), "y", writeable=True)
        self.check(self.lib.qmoe_gemm(context.handle, matrix.ref, accuracy, m, x.ctypes.data, k,
                                      y.ctypes.data, n, 0, n), "qmoe_gemm")
        return y

    # --- Expert sets and the MoE layer ----------------------------------------------------

    def expert_set_from_onnx(self, fc1, fc1_scales, fc2, fc2_scales, block_size,
                             swiglu_fusion=QMOE_SWIGLU_INTERLEAVED, alpha=1.0, beta=0.0,
                             limit=math.inf, fp16_scales=False):
        """An ExpertSet from ONNX Runtime QMoE-layout INT4 weights, as its CPU kernel reads
        them: fc1 uint8 [E, 2I, H/2], fc1_scales float32 [E, 2I, H/block], fc2 uint8
        [E, H, I/2], fc2_scales float32 [E, H, I/block] (no zero points: 8; no biases).
        Codes are imported into the canonical layout. fp16_scales:
          False     the FP32 scales are read in place ([N, K/block], as ORT reads them);
          "grouped" FP16 planes in the grouped order of docs/formats.md, and every expert's
                    codes in one qmoe_alloc_weight_memory buffer (huge pages): what qmoe run
                    and the benchmarks use, and what docs/abi.md recommends;
          True      FP16 planes [K/block, N] (block-major).
        FP16 planes need FP16-representable values (checked). fc1 and fc2 must be uint8 (or
        integers that all fit in it: checked, never cast)."""
        block_size = _u32(block_size, "block_size")
        swiglu_fusion = _c_int(swiglu_fusion, "swiglu_fusion")
        if block_size == 0:
            raise ValueError("expert_set_from_onnx: block_size must not be 0")
        fc1 = _exact_integer_array(fc1, np.uint8, "fc1")
        fc2 = _exact_integer_array(fc2, np.uint8, "fc2")
        fc1_scales, fc2_scales = np.asarray(fc1_scales), np.asarray(fc2_scales)
        if fc1.ndim != 3:
            raise ValueError(f"expert_set_from_onnx: fc1 must be [E, 2I, H/2], got {fc1.shape}")
        e_count, two_i, h_half = fc1.shape
        hidden, inter = 2 * h_half, two_i // 2
        for value, what in ((e_count, "E"), (two_i, "2I"), (hidden, "H")):
            _u32(value, f"expert_set_from_onnx: {what}")
        if (fc2.shape != (e_count, hidden, inter // 2)
                or fc1_scales.shape != (e_count, two_i, hidden // block_size)
                or fc2_scales.shape != (e_count, hidden, inter // block_size)):
            raise ValueError("expert_set_from_onnx: inconsistent shapes "
                             f"{fc1.shape} {fc1_scales.shape} {fc2.shape} {fc2_scales.shape}")
        s1 = _f32_array(fc1_scales, fc1_scales.shape, "fc1_scales")
        s2 = _f32_array(fc2_scales, fc2_scales.shape, "fc2_scales")
        group1 = group2 = 0
        if fp16_scales:
            h1, h2 = s1.astype(np.float16), s2.astype(np.float16)
            if not (np.array_equal(h1.astype(np.float32), s1) and
                    np.array_equal(h2.astype(np.float32), s2)):
                raise ValueError("expert_set_from_onnx: scales are not FP16-representable")
            dtype = QMOE_DTYPE_F16
            if fp16_scales == "grouped":
                s1, s2 = self.grouped_planes(h1), self.grouped_planes(h2)
                blocks1, blocks2 = hidden // block_size, inter // block_size
                strides1, strides2 = (1, 8), (1, 8)
                group1, group2 = 8 * blocks1, 8 * blocks2
            else:
                s1 = np.ascontiguousarray(h1.transpose(0, 2, 1))
                s2 = np.ascontiguousarray(h2.transpose(0, 2, 1))
                strides1, strides2 = (1, two_i), (1, hidden)
        else:
            dtype = QMOE_DTYPE_F32
            strides1, strides2 = (hidden // block_size, 1), (inter // block_size, 1)
        size1, size2 = self.codes_size(two_i, hidden), self.codes_size(hidden, inter)
        arena = self.weight_memory(e_count * (size1 + size2)) if fp16_scales == "grouped" \
            else None
        codes, structs1, structs2 = [], [], []
        for e in range(e_count):
            out1 = out2 = None
            if arena is not None:
                base = e * (size1 + size2)
                out1, out2 = arena[base:base + size1], arena[base + size1:base + size1 + size2]
            c1 = self.import_onnx_codes(fc1[e], two_i, hidden, out1)
            c2 = self.import_onnx_codes(fc2[e], hidden, inter, out2)
            codes += [c1, c2]
            structs1.append(self.describe_matrix(c1, two_i, hidden, block_size, s1[e], dtype,
                                                 *strides1, group1))
            structs2.append(self.describe_matrix(c2, hidden, inter, block_size, s2[e], dtype,
                                                 *strides2, group2))
        nbytes = sum(c.nbytes for c in codes) + s1.nbytes + s2.nbytes
        return self._create_expert_set(structs1, structs2, hidden, inter, swiglu_fusion, alpha,
                                       beta, limit, (codes, s1, s2), nbytes)

    def expert_set(self, fc1, fc2, swiglu_fusion=QMOE_SWIGLU_INTERLEAVED, alpha=1.0, beta=0.0,
                   limit=math.inf):
        """An ExpertSet from Matrix objects (Library.matrix, import_onnx_matrix), one FC1
        [2I, H] and one FC2 [H, I] per expert, each projection in any format: H is fc1[0]'s k
        and I fc2[0]'s k, and the library checks every expert against them
        (qmoe_expert_set_create; QmoeError naming the expert and field). fc1 and fc2 must be
        sequences of Matrix of the same nonzero length. The set keeps the matrices (and so
        their buffers) alive."""
        fc1, fc2 = list(fc1), list(fc2)
        for name, matrices in (("fc1", fc1), ("fc2", fc2)):
            for e, matrix in enumerate(matrices):
                if not isinstance(matrix, Matrix):
                    raise TypeError(f"expert_set: {name}[{e}] must be a Matrix, got "
                                    f"{type(matrix).__name__}")
        if not fc1 or len(fc1) != len(fc2):
            raise ValueError(f"expert_set: fc1 and fc2 must hold one Matrix per expert, the "
                             f"same nonzero number, got {len(fc1)} and {len(fc2)}")
        swiglu_fusion = _c_int(swiglu_fusion, "swiglu_fusion")
        hidden, inter = fc1[0].struct.k, fc2[0].struct.k
        nbytes = sum(m.nbytes for m in fc1 + fc2)
        return self._create_expert_set([m.struct for m in fc1], [m.struct for m in fc2], hidden,
                                       inter, swiglu_fusion, alpha, beta, limit, (fc1, fc2),
                                       nbytes)

    def _create_expert_set(self, structs1, structs2, hidden, inter, swiglu_fusion, alpha, beta,
                           limit, keep, nbytes):
        """qmoe_expert_set_create over QuantMatrix structs; `keep` holds what they point at."""
        e_count = len(structs1)
        p_fc1 = (ctypes.POINTER(QuantMatrix) * e_count)(*[ctypes.pointer(s) for s in structs1])
        p_fc2 = (ctypes.POINTER(QuantMatrix) * e_count)(*[ctypes.pointer(s) for s in structs2])
        desc = ExpertSetDesc()
        self.lib.qmoe_expert_set_desc_init(ctypes.byref(desc))
        desc.num_experts, desc.hidden, desc.intermediate = e_count, hidden, inter
        desc.swiglu_fusion = swiglu_fusion
        desc.fc1, desc.fc2 = p_fc1, p_fc2
        desc.swiglu_alpha, desc.swiglu_beta, desc.swiglu_limit = alpha, beta, limit
        handle = ctypes.c_void_p()
        self.check(self.lib.qmoe_expert_set_create(ctypes.byref(desc), ctypes.byref(handle)),
                   "qmoe_expert_set_create")
        # The set copies the descriptions; the codes and scales must outlive it.
        return ExpertSet(self, handle, keep, nbytes, e_count, hidden)

    def expert_cache(self, num_layers, num_experts, num_slots, policy="lfru",
                     half_life_steps=32.0, max_promotions_per_step=0, admission_margin=0.0):
        """A qmoe_expert_cache: `policy` "static", "lru", "lfu" or "lfru"."""
        if policy not in CACHE_POLICIES:
            raise ValueError(f"policy {policy!r} is not one of {sorted(CACHE_POLICIES)}")
        d = ExpertCacheDesc()
        self.lib.qmoe_expert_cache_desc_init(ctypes.byref(d))
        d.num_layers = _u32(num_layers, "num_layers")
        d.num_experts = _u32(num_experts, "num_experts")
        d.num_slots = _u32(num_slots, "num_slots")
        d.policy = CACHE_POLICIES[policy]
        d.half_life_steps = float(half_life_steps)
        d.max_promotions_per_step = _u32(max_promotions_per_step, "max_promotions_per_step")
        d.admission_margin = float(admission_margin)
        handle = _P()
        self.check(self.lib.qmoe_expert_cache_create(ctypes.byref(d), ctypes.byref(handle)),
                   "qmoe_expert_cache_create")
        return ExpertCache(self, handle, d.num_layers, d.num_experts, d.num_slots)

    def write_expert_store(self, path, expert_sets):
        """Writes the layers' ExpertSets (one shape) to an expert store file at `path`."""
        if not expert_sets:
            raise ValueError("expert_sets: no layers")
        handles = (_P * len(expert_sets))(*[s.handle for s in expert_sets])
        self.check(self.lib.qmoe_expert_store_write(os.fsencode(path), handles,
                                                    len(expert_sets)), "qmoe_expert_store_write")

    def open_expert_store(self, path):
        """An ExpertStore over the file at `path` (its header checked)."""
        handle = _P()
        self.check(self.lib.qmoe_expert_store_open(os.fsencode(path), ctypes.byref(handle)),
                   "qmoe_expert_store_open")
        info = ExpertStoreInfo()
        info.struct_size = ctypes.sizeof(ExpertStoreInfo)
        status = self.lib.qmoe_expert_store_get_info(handle, ctypes.byref(info))
        if status != QMOE_STATUS_OK:
            self.lib.qmoe_expert_store_close(handle)
            self.check(status, "qmoe_expert_store_get_info")
        return ExpertStore(self, handle,
                           {name: getattr(info, name) for name, _ in ExpertStoreInfo._fields_[1:]})

    def route_topk(self, logits, k, renormalize=True):
        """qmoe_moe_route_topk on float32 logits [m, E]: (ids int32 [m, k], weights float32)."""
        m, e_count = logits.shape
        m, e_count = _u32(m, "m (rows of logits)"), _u32(e_count, "E (columns of logits)")
        k = _u32(k, "k")
        logits = _f32_array(logits, (m, e_count), "logits")
        ids = np.zeros((m, k), dtype=np.int32)
        weights = np.zeros((m, k), dtype=np.float32)
        self.check(self.lib.qmoe_moe_route_topk(logits.ctypes.data, m, e_count, k,
                                                int(renormalize), ids.ctypes.data,
                                                weights.ctypes.data), "qmoe_moe_route_topk")
        return ids, weights

    def moe_forward(self, context, expert_set, accuracy, x, ids, weights, y=None):
        """qmoe_moe_forward with routing ids/weights [m, k] on x [m, H], float32 or float16
        (QMOE_DTYPE_F16); returns y of x's type. ids must be an
        integer array whose values fit in int32 (converted only then, never cast); y, when
        given, a writeable C-contiguous array of x's type and shape."""
        ids = _exact_integer_array(ids, np.int32, "ids")
        if ids.ndim != 2:
            raise ValueError(f"ids must be [m, k], got shape {ids.shape}")
        m, k = _u32(ids.shape[0], "m (rows of ids)"), _u32(ids.shape[1], "k (columns of ids)")
        accuracy = _c_int(accuracy, "accuracy")
        dtype = _activation_dtype(x)
        x = _checked_array(x, dtype, (m, expert_set.hidden), "x")
        weights = _f32_array(weights, (m, k), "weights")
        if y is None:
            y = np.zeros_like(x)
        y = _checked_array(y, dtype, x.shape, "y", writeable=True)
        params = self._moe_params(accuracy, dtype, x, y, k)
        params.ids, params.weights = ids.ctypes.data, weights.ctypes.data
        self.check(self.lib.qmoe_moe_forward(context.handle, expert_set.handle,
                                             ctypes.byref(params)), "qmoe_moe_forward")
        return y

    def _moe_params(self, accuracy, dtype, x, y, k):
        """A qmoe_moe_params for x and y [m, H] of `dtype` (float32 or float16), k slots."""
        params = MoeParams()
        self.lib.qmoe_moe_params_init(ctypes.byref(params))
        params.accuracy = accuracy
        params.m = x.shape[0]
        params.dtype = QMOE_DTYPE_F32 if dtype == np.float32 else QMOE_DTYPE_F16
        params.x, params.ldx = x.ctypes.data, x.shape[1]
        params.y, params.ldy = y.ctypes.data, y.shape[1]
        params.k = k
        return params

    def forward_logits_call(self, context, expert_set, accuracy, x, logits, k, y,
                            renormalize=True):
        """A no-argument callable that runs qmoe_moe_forward on x and router logits into y (all
        float32, or all float16 as QMOE_DTYPE_F16), with
        every argument converted once (one bare ctypes call per run, for timing loops; the
        arrays are read at each call, so their contents may change between calls)."""
        m = _u32(np.shape(x)[0], "m (rows of x)")
        accuracy, k = _c_int(accuracy, "accuracy"), _u32(k, "k")
        dtype = _activation_dtype(x)
        x = _checked_array(x, dtype, (m, expert_set.hidden), "x")
        logits = _checked_array(logits, dtype, (m, expert_set.num_experts), "logits")
        y = _checked_array(y, dtype, x.shape, "y", writeable=True)
        params = self._moe_params(accuracy, dtype, x, y, k)
        params.logits, params.renormalize = logits.ctypes.data, int(renormalize)
        function, check = self.lib.qmoe_moe_forward, self.check
        args = (context.handle, expert_set.handle, ctypes.byref(params))

        def call():
            status = function(*args)
            if status != QMOE_STATUS_OK:
                check(status, "qmoe_moe_forward")
        # Everything the bare call reaches: the arrays, and the set and context behind the raw
        # handles (an ExpertSet built inside the call expression would otherwise be collected
        # with the weights its C set points at, and call() read freed memory).
        call.keep = (x, logits, y, expert_set, context, params)
        return call

    def moe_forward_logits(self, context, expert_set, accuracy, x, logits, k,
                           renormalize=True):
        """qmoe_moe_forward on router logits: route logits [m, E] (top-k, softmax, renormalised
        unless told otherwise) and run the layer on x [m, H], all float32 or all float16;
        returns y [m, H] of x's type."""
        y = np.zeros_like(x)
        self.forward_logits_call(context, expert_set, accuracy, x, logits, k, y, renormalize)()
        return y
