"""ONNX Runtime's com.microsoft.QMoE operator as an independent reference for libqmoe's MoE
layer: random INT4 layers in the operator's weight layout, one-node (or one-node-per-layer)
ONNX models, and sessions with inputs and outputs bound once.

Why: tests/python/onnxruntime_qmoe_test.py and `benchmarks/compare_onnxruntime.py moe` feed the same
bytes to ORT's CPU QMoE kernel and to libqmoe (python/libqmoe.py), so this module is the one
place that knows the operator's interface.

The operator, as onnxruntime 1.32 defines it (the schema is read at run time by
`qmoe_schema_inputs`; the kernel is onnxruntime/contrib_ops/cpu/moe/moe_quantization_cpu.cc):
  inputs   0 input [M, H], 1 router_probs [M, E] (router logits, see below),
           2 fc1_experts_weights uint8 [E, 2I, H/2], 3 fc1_scales [E, 2I, H/block],
           4 fc1_experts_bias, 5 fc2_experts_weights uint8 [E, H, I/2],
           6 fc2_scales [E, H, I/block], 7 fc2_experts_bias, 8-10 fc3 (unsupported on CPU),
           11 fc1_zero_points, 12 fc2_zero_points ([E, N, ceil(K/block/2)] packed nibbles,
           optional: 8 when absent), 13 fc3_zero_points, 14 router_weights, 15-20 FP4/FP8 only;
  attrs    k, activation_type ("swiglu"), swiglu_fusion (1: gate row 2i, up row 2i + 1; the
           only fusion the CPU kernel accepts), normalize_routing_weights, expert_weight_bits,
           block_size, activation_alpha (default 1), activation_beta (default 0), swiglu_limit
           (default +inf), accuracy_level (0: FP32 activations; 4: int8 activations per
           block, as MatMulNBits), weights_prepacked (0: the raw layout above).
  routing  without router_weights the kernel takes the top k of router_probs
           (std::partial_sort of (value, id) pairs with std::greater: equal values rank the
           higher id first) and weights them exp(l - max) / sum over the k selected, i.e. a
           softmax over the selected logits that sums to 1, whatever normalize_routing_weights
           says; routes with weight <= 1e-8 are skipped. libqmoe's qmoe_moe_forward on logits with
           renormalize = 1 computes the same (equal logits: lower id first).
  SwiGLU   g = min(g, limit), u = clamp(u, -limit, limit), g * sigmoid(alpha g) * (u + beta).
INT4 codes: byte j of a row holds k = 2j in its low nibble and 2j + 1 in its high nibble;
W = (code - 8) * scale with FP32 scales (the type of the input).
"""

import math

import numpy as np
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper

# SwiGLU parameters (alpha, beta, limit) of the two model families libqmoe targets.
QWEN3_SWIGLU = (1.0, 0.0, math.inf)
GPT_OSS_SWIGLU = (1.702, 1.0, 7.0)


class QMoELayer:
    """Random INT4 weights of one MoE layer in QMoE's layout, FP16-representable FP32 scales.

    fc1 uint8 [E, 2I, H/2] (gate/up interleaved rows), fc1_scales float32 [E, 2I, H/block],
    fc2 uint8 [E, H, I/2], fc2_scales float32 [E, H, I/block]. Scale magnitudes are
    2^[lo, hi) with random signs; `fc1_exp` and `fc2_exp` give (lo, hi).
    """

    def __init__(self, experts, hidden, inter, block, rng, fc1_exp=(-8.0, -5.0),
                 fc2_exp=(-8.0, -5.0)):
        self.experts, self.hidden, self.inter, self.block = experts, hidden, inter, block
        self.fc1 = rng.integers(0, 256, size=(experts, 2 * inter, hidden // 2), dtype=np.uint8)
        self.fc2 = rng.integers(0, 256, size=(experts, hidden, inter // 2), dtype=np.uint8)
        self.fc1_scales = self._scales(rng, (experts, 2 * inter, hidden // block), fc1_exp)
        self.fc2_scales = self._scales(rng, (experts, hidden, inter // block), fc2_exp)

    @staticmethod
    def _scales(rng, shape, exponents):
        magnitude = np.exp2(rng.uniform(*exponents, size=shape))
        sign = np.where(rng.integers(0, 2, size=shape) == 1, -1.0, 1.0)
        return (sign * magnitude).astype(np.float16).astype(np.float32)

    @property
    def nbytes(self):
        """Bytes of the ORT-layout tensors (codes and FP32 scales)."""
        return self.fc1.nbytes + self.fc2.nbytes + self.fc1_scales.nbytes + \
            self.fc2_scales.nbytes

    def _dense(self, codes, scales, e):
        low = (codes[e] & 0x0F).astype(np.int16)
        high = (codes[e] >> 4).astype(np.int16)
        n = codes.shape[1]
        q = np.stack([low, high], axis=-1).reshape(n, -1)  # even k: low nibble
        return (q - 8).astype(np.float64) * np.repeat(scales[e].astype(np.float64), self.block,
                                                      axis=1)

    def dense_fc1(self, e):
        """Expert e's FC1 W[2I, H] in float64 (rows interleaved: gate 2i, up 2i + 1)."""
        return self._dense(self.fc1, self.fc1_scales, e)

    def dense_fc2(self, e):
        """Expert e's FC2 W[H, I] in float64."""
        return self._dense(self.fc2, self.fc2_scales, e)

    def expert_set(self, library, swiglu, fp16_scales=False):
        """The same layer as a libqmoe ExpertSet (python/libqmoe.py), SwiGLU (alpha, beta,
        limit), imported with the ONNX-layout importer; the FP32 scales are read in place, or
        converted to FP16 planes (the same values) as Library.expert_set_from_onnx's
        fp16_scales says (True: [K/block, N]; "grouped": the grouped order)."""
        alpha, beta, limit = swiglu
        return library.expert_set_from_onnx(self.fc1, self.fc1_scales, self.fc2,
                                            self.fc2_scales, self.block, alpha=alpha,
                                            beta=beta, limit=limit, fp16_scales=fp16_scales)


def qmoe_model(layers, k, swiglu, accuracy_level, dtype=np.float32):
    """Serialized ONNX model (IR 10; opsets "" 21 and com.microsoft 1) with one QMoE node per
    layer, all reading inputs X [M, H] and R [M, E] (router logits); node i writes Y<i>.
    `dtype` (np.float32 or np.float16) is QMoE's T: of X, R, Y and the scales (FP16 scales
    hold the same values, the layer's scales being FP16-representable)."""
    first = layers[0]
    elem = TensorProto.FLOAT16 if dtype == np.float16 else TensorProto.FLOAT
    alpha, beta, limit = swiglu
    attributes = dict(k=k, activation_type="swiglu", swiglu_fusion=1,
                      normalize_routing_weights=1, expert_weight_bits=4,
                      block_size=first.block, activation_alpha=alpha, activation_beta=beta,
                      accuracy_level=accuracy_level, weights_prepacked=0)
    if math.isfinite(limit):
        attributes["swiglu_limit"] = limit
    known = qmoe_schema_attributes()
    if known is not None:
        # An older onnxruntime (1.30) rejects attributes it does not know. Those at the value
        # its kernel computes anyway (FP32 activations, raw weights) are left out; any other
        # unknown attribute would change the result, so the caller must not get here (see
        # missing_attributes and accuracy_levels).
        for name, implied in OPTIONAL_ATTRIBUTES.items():
            if name not in known and attributes.get(name) == implied:
                del attributes[name]
        missing = sorted(set(attributes) - known)
        if missing:
            raise ValueError(f"this onnxruntime's QMoE lacks attribute(s) {missing}")
    nodes, inits, outputs = [], [], []
    for i, layer in enumerate(layers):
        names = [f"fc1_{i}", f"fc1_scales_{i}", f"fc2_{i}", f"fc2_scales_{i}"]
        for name, array in zip(names, (layer.fc1, layer.fc1_scales.astype(dtype), layer.fc2,
                                       layer.fc2_scales.astype(dtype))):
            inits.append(numpy_helper.from_array(array, name))
        nodes.append(helper.make_node(
            "QMoE", ["X", "R", names[0], names[1], "", names[2], names[3]], [f"Y{i}"],
            domain="com.microsoft", name=f"qmoe_{i}", **attributes))
        outputs.append(helper.make_tensor_value_info(f"Y{i}", elem, ["M", first.hidden]))
    inputs = [helper.make_tensor_value_info("X", elem, ["M", first.hidden]),
              helper.make_tensor_value_info("R", elem, ["M", first.experts])]
    graph = helper.make_graph(nodes, "qmoe", inputs, outputs, inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21),
                                                    helper.make_opsetid("com.microsoft", 1)])
    model.ir_version = 10  # onnxruntime 1.30+ accepts IR <= 10
    return model.SerializeToString()


def session_options(threads):
    """CPU session options: `threads` intra-op threads, sequential, warnings off."""
    so = ort.SessionOptions()
    so.intra_op_num_threads = threads
    so.inter_op_num_threads = 1
    so.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    so.log_severity_level = 3
    return so


class QMoERunner:
    """An InferenceSession of a qmoe_model, with X, R and every output bound once; `run()` then
    runs every layer on the bound arrays (whose contents may change between runs)."""

    def __init__(self, model_bytes, threads, num_layers, hidden):
        self.session = ort.InferenceSession(model_bytes, session_options(threads),
                                            providers=["CPUExecutionProvider"])
        self.num_layers, self.hidden = num_layers, hidden
        self.binding = None

    def bind(self, x, logits):
        """Bind x [M, H] and logits [M, E] (float32, or float16 for a float16 model; shared
        with ORT, not copied); outputs go to self.ys[i] [M, H], of x's type."""
        self.x, self.logits = x, logits
        self.ys = [np.zeros((x.shape[0], self.hidden), dtype=x.dtype)
                   for _ in range(self.num_layers)]
        binding = self.session.io_binding()
        binding.bind_ortvalue_input("X", ort.OrtValue.ortvalue_from_numpy(x))
        binding.bind_ortvalue_input("R", ort.OrtValue.ortvalue_from_numpy(logits))
        for i, y in enumerate(self.ys):
            binding.bind_ortvalue_output(f"Y{i}", ort.OrtValue.ortvalue_from_numpy(y))
        self.binding = binding

    def run(self):
        self.session.run_with_iobinding(self.binding)

    def forward(self, x, logits):
        """Bind, run once and return a copy of every layer's output."""
        self.bind(x, logits)
        self.run()
        return [y.copy() for y in self.ys]


# Attributes an older QMoE may lack, with the value its kernel then implies.
OPTIONAL_ATTRIBUTES = {"accuracy_level": 0, "weights_prepacked": 0}
# Attributes every comparison needs: without them the operator computes something else.
REQUIRED_ATTRIBUTES = ("k", "activation_type", "swiglu_fusion", "normalize_routing_weights",
                       "expert_weight_bits", "block_size", "activation_alpha",
                       "activation_beta", "swiglu_limit")


def qmoe_schema():
    """This onnxruntime's com.microsoft.QMoE schema, or None if it is not exposed."""
    try:
        from onnxruntime.capi import onnxruntime_pybind11_state as state
        schemas = [s for s in state.get_all_operator_schema()
                   if s.name == "QMoE" and s.domain == "com.microsoft"]
    except (ImportError, AttributeError):
        return None
    return max(schemas, key=lambda s: s.since_version) if schemas else None


def qmoe_schema_attributes():
    """Names of QMoE's attributes in this onnxruntime (None if the schema is not exposed)."""
    schema = qmoe_schema()
    return None if schema is None else set(schema.attributes)


def missing_attributes():
    """The REQUIRED_ATTRIBUTES this onnxruntime's QMoE lacks (empty if the schema is not
    exposed: then the session itself reports what it rejects)."""
    known = qmoe_schema_attributes()
    return [] if known is None else [a for a in REQUIRED_ATTRIBUTES if a not in known]


def accuracy_levels():
    """The accuracy levels a QMoE model can ask for here: (0, 4), or (0,) where the schema has
    no accuracy_level (onnxruntime 1.30: FP32 activations only)."""
    known = qmoe_schema_attributes()
    return (0,) if known is not None and "accuracy_level" not in known else (0, 4)


def qmoe_schema_inputs():
    """Names of QMoE's inputs in this onnxruntime, in order (None if the schema is not
    exposed)."""
    schema = qmoe_schema()
    return None if schema is None else [i.name for i in schema.inputs]
