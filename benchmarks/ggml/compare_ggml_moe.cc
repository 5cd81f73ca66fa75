// compare_ggml_moe.cc: the MoE chain rows of compare_ggml (compare_ggml.cc says what is
// compared and how it is timed).
#include "compare_ggml_common.h"

namespace qmoe_ggml {
namespace {

// --- MoE chain --------------------------------------------------------------------------------

constexpr float kRmsEps = 1e-6f;

// One layer's bytes as ggml holds them: gate [E][I rows of H], up [E][I rows of H],
// down [E][H rows of I] (llama.cpp's ffn_gate_exps, ffn_up_exps, ffn_down_exps).
struct LayerBytes {
  std::vector<uint8_t> gate, up, down;
  LayerBytes(const Format& f, int layer) {
    const size_t gate_bytes = size_t{kExperts} * kInter * row_bytes(f, kHidden);
    const size_t down_bytes = size_t{kExperts} * kHidden * row_bytes(f, kInter);
    gate.resize(gate_bytes);
    up.resize(gate_bytes);
    down.resize(down_bytes);
    const uint64_t seed = 0x3E7A0000ull + uint64_t(layer) * 3;
    fill_blocks(f, gate_bytes / f.block_bytes, seed, gate.data());
    fill_blocks(f, gate_bytes / f.block_bytes, seed + 1, up.data());
    fill_blocks(f, down_bytes / f.block_bytes, seed + 2, down.data());
  }
};

// One layer in libqmoe: per expert FC1 [2I, H] (gate rows then up rows: concatenated fusion)
// and FC2 [H, I], imported from the same bytes.
struct QmoeLayer {
  std::unique_ptr<WeightMemory> mem;
  std::vector<qmoe_quant_matrix> fc1, fc2;
  qmoe_expert_set* set = nullptr;
  ~QmoeLayer() { qmoe_expert_set_destroy(set); }

  QmoeLayer(const Format& f, const LayerBytes& b) : fc1(kExperts), fc2(kExperts) {
    const size_t s1 = align64(qmoe_matrix_bytes(f, 2 * kInter, kHidden));
    const size_t s2 = align64(qmoe_matrix_bytes(f, kHidden, kInter));
    mem.reset(new WeightMemory((s1 + s2) * kExperts));
    const size_t gate_expert = size_t{kInter} * row_bytes(f, kHidden);
    const size_t down_expert = size_t{kHidden} * row_bytes(f, kInter);
    for (uint32_t e = 0; e < kExperts; ++e) {
      uint8_t* slot = mem->bytes() + e * (s1 + s2);
      fc1[e] = import_matrix(f, 2 * kInter, kHidden, b.gate.data() + e * gate_expert, kInter,
                             b.up.data() + e * gate_expert, slot);
      fc2[e] = import_matrix(f, kHidden, kInter, b.down.data() + e * down_expert, kHidden, nullptr,
                             slot + s1);
    }
    std::vector<const qmoe_quant_matrix*> p1(kExperts), p2(kExperts);
    for (uint32_t e = 0; e < kExperts; ++e) p1[e] = &fc1[e], p2[e] = &fc2[e];
    qmoe_expert_set_desc d;
    qmoe_expert_set_desc_init(&d);
    d.num_experts = kExperts;
    d.hidden = kHidden;
    d.intermediate = kInter;
    d.swiglu_fusion = QMOE_SWIGLU_CONCATENATED;
    d.fc1 = p1.data();
    d.fc2 = p2.data();
    check(qmoe_expert_set_create(&d, &set), "qmoe_expert_set_create");
  }
  QmoeLayer(const QmoeLayer&) = delete;
  QmoeLayer& operator=(const QmoeLayer&) = delete;
};

// Routes: per route and layer, kTop distinct experts and softmax weights over them.
struct Routes {
  int count = 0, layers = 0;
  std::vector<int32_t> ids;
  std::vector<float> weights;
  Routes(int n, int num_layers) : count(n), layers(num_layers) {
    ids.resize(size_t(n) * num_layers * kTop);
    weights.resize(ids.size());
    uint64_t seed = 0x2017E5;
    for (size_t r = 0; r < size_t(n) * num_layers; ++r) {
      int32_t* id = &ids[r * kTop];
      float* w = &weights[r * kTop];
      for (uint32_t j = 0; j < kTop; ++j) {
        bool fresh;
        do {
          id[j] = static_cast<int32_t>(splitmix64(seed) % kExperts);
          fresh = std::find(id, id + j, id[j]) == id + j;
        } while (!fresh);
      }
      double sum = 0;
      for (uint32_t j = 0; j < kTop; ++j)
        sum += w[j] = std::exp(2.0f * ((splitmix64(seed) >> 40) * 0x1.0p-24f));
      for (uint32_t j = 0; j < kTop; ++j) w[j] = static_cast<float>(w[j] / sum);
    }
  }
  const int32_t* id(int route, int layer) const {
    return &ids[(size_t(route) * layers + layer) * kTop];
  }
  const float* weight(int route, int layer) const {
    return &weights[(size_t(route) * layers + layer) * kTop];
  }
};

void rms_norm(const float* x, float* y, size_t n) {  // as ggml_rms_norm computes it
  double sum = 0;
  for (size_t i = 0; i < n; ++i) sum += static_cast<double>(x[i] * x[i]);
  const float scale = 1.0f / std::sqrt(static_cast<float>(sum / n) + kRmsEps);
  for (size_t i = 0; i < n; ++i) y[i] = x[i] * scale;
}

// The chain on libqmoe: per layer h = rms_norm(x); x += moe(h) (qmoe_moe_forward accumulating).
void qmoe_chain(qmoe_context* ctx, const std::vector<const QmoeLayer*>& layers,
                const Routes& routes, int route, float* x, float* h) {
  for (size_t l = 0; l < layers.size(); ++l) {
    rms_norm(x, h, kHidden);
    qmoe_moe_params p;
    qmoe_moe_params_init(&p);
    p.accuracy = QMOE_ACCURACY_FAST;
    p.m = 1;
    p.x = h;
    p.ldx = kHidden;
    p.y = x;
    p.ldy = kHidden;
    p.k = kTop;
    p.ids = routes.id(route, static_cast<int>(l));
    p.weights = routes.weight(route, static_cast<int>(l));
    p.accumulate = 1;
    check(qmoe_moe_forward(ctx, layers[l]->set, &p), "qmoe_moe_forward");
  }
}

// The chain in FP64 from ggml's plain tensors (the original blocks).
void reference_chain(const Format& f, const std::vector<ggml_tensor*>& w, const Routes& routes,
                     int route, const float* x0, std::vector<double>& x) {
  const size_t layers = w.size() / 3;
  x.assign(x0, x0 + kHidden);
  std::vector<double> h(kHidden), a(kInter), row(kHidden);
  for (size_t l = 0; l < layers; ++l) {
    double sum = 0;
    for (double v : x) sum += v * v;
    const double scale = 1.0 / std::sqrt(sum / kHidden + kRmsEps);
    for (uint32_t i = 0; i < kHidden; ++i) h[i] = x[i] * scale;
    std::vector<double> y(kHidden, 0.0);
    for (uint32_t j = 0; j < kTop; ++j) {
      const size_t e = static_cast<size_t>(routes.id(route, static_cast<int>(l))[j]);
      const auto* gate = static_cast<const uint8_t*>(w[3 * l]->data) + e * w[3 * l]->nb[2];
      const auto* up = static_cast<const uint8_t*>(w[3 * l + 1]->data) + e * w[3 * l + 1]->nb[2];
      const auto* down = static_cast<const uint8_t*>(w[3 * l + 2]->data) + e * w[3 * l + 2]->nb[2];
      for (uint32_t i = 0; i < kInter; ++i) {
        double g = 0, u = 0;
        dequantize_row(f, gate + i * row_bytes(f, kHidden), kHidden, row.data());
        for (uint32_t k = 0; k < kHidden; ++k) g += row[k] * h[k];
        dequantize_row(f, up + i * row_bytes(f, kHidden), kHidden, row.data());
        for (uint32_t k = 0; k < kHidden; ++k) u += row[k] * h[k];
        a[i] = g / (1.0 + std::exp(-g)) * u;
      }
      const double rw = routes.weight(route, static_cast<int>(l))[j];
      for (uint32_t n = 0; n < kHidden; ++n) {
        dequantize_row(f, down + n * row_bytes(f, kInter), kInter, row.data());
        double acc = 0;
        for (uint32_t k = 0; k < kInter; ++k) acc += row[k] * a[k];
        y[n] += rw * acc;
      }
    }
    for (uint32_t i = 0; i < kHidden; ++i) x[i] += y[i];
  }
}

// The chain as llama.cpp's build_moe_ffn builds each layer (routing given as inputs).
struct GgmlChain {
  ggml_context* ctx = nullptr;
  ggml_cgraph* graph = nullptr;
  ggml_gallocr_t galloc = nullptr;
  ggml_tensor* x = nullptr;
  ggml_tensor* out = nullptr;
  std::vector<ggml_tensor*> sel, wts;

  GgmlChain(Ggml& g, const std::vector<ggml_tensor*>& w) {
    const size_t layers = w.size() / 3;
    const size_t nodes = 64 * layers + 16;
    ctx = new_meta_context(nodes, nodes, 1);
    x = ggml_new_tensor_2d(ctx, GGML_TYPE_F32, kHidden, 1);
    ggml_set_input(x);
    graph = ggml_new_graph_custom(ctx, nodes, false);
    ggml_tensor* cur = x;
    for (size_t l = 0; l < layers; ++l) {
      ggml_tensor* s = ggml_new_tensor_2d(ctx, GGML_TYPE_I32, kTop, 1);
      ggml_tensor* rw = ggml_new_tensor_3d(ctx, GGML_TYPE_F32, 1, kTop, 1);
      ggml_set_input(s);
      ggml_set_input(rw);
      sel.push_back(s);
      wts.push_back(rw);
      ggml_tensor* h = ggml_rms_norm(ctx, cur, kRmsEps);
      h = ggml_reshape_3d(ctx, h, kHidden, 1, 1);
      ggml_tensor* up = ggml_mul_mat_id(ctx, w[3 * l + 1], h, s);  // [I, top, 1]
      ggml_tensor* gate = ggml_mul_mat_id(ctx, w[3 * l], h, s);    // [I, top, 1]
      ggml_tensor* act = ggml_swiglu_split(ctx, gate, up);
      ggml_tensor* experts = ggml_mul_mat_id(ctx, w[3 * l + 2], act, s);  // [H, top, 1]
      experts = ggml_mul(ctx, experts, rw);
      ggml_tensor* views[kTop];
      for (uint32_t i = 0; i < kTop; ++i) {
        views[i] = ggml_view_2d(ctx, experts, kHidden, 1, experts->nb[2], i * experts->nb[1]);
        ggml_build_forward_expand(graph, views[i]);
      }
      ggml_tensor* moe = views[0];
      for (uint32_t i = 1; i < kTop; ++i) {
        moe = ggml_add(ctx, moe, views[i]);
        ggml_build_forward_expand(graph, moe);
      }
      cur = ggml_add(ctx, cur, moe);
    }
    out = cur;
    ggml_set_output(out);
    ggml_build_forward_expand(graph, out);
    galloc = ggml_gallocr_new(ggml_backend_get_default_buffer_type(g.backend));
    if (!ggml_gallocr_alloc_graph(galloc, graph)) die("ggml_gallocr_alloc_graph failed");
  }
  ~GgmlChain() {
    ggml_gallocr_free(galloc);
    ggml_free(ctx);
  }
  GgmlChain(const GgmlChain&) = delete;
  GgmlChain& operator=(const GgmlChain&) = delete;

  void run(Ggml& g, const Routes& routes, int route, const float* x_in, float* x_out) {
    ggml_backend_tensor_set(x, x_in, 0, sizeof(float) * kHidden);
    for (size_t l = 0; l < sel.size(); ++l) {
      ggml_backend_tensor_set(sel[l], routes.id(route, static_cast<int>(l)), 0, 4 * kTop);
      ggml_backend_tensor_set(wts[l], routes.weight(route, static_cast<int>(l)), 0, 4 * kTop);
    }
    g.compute(graph);
    ggml_backend_tensor_get(out, x_out, 0, sizeof(float) * kHidden);
  }
};

}  // namespace

void run_moe(const Options& o, Ggml& g, const Format& f) {
  const int layers = o.layers;
  const int distinct = o.distinct > 0 && o.distinct < layers ? o.distinct : layers;
  std::printf("moe   %-6s building %d layers, %d with weights of their own (%.2f GB per copy)...\n",
              f.name, layers, distinct,
              distinct *
                  (2.0 * kExperts * kInter * row_bytes(f, kHidden) +
                   1.0 * kExperts * kHidden * row_bytes(f, kInter)) /
                  1e9);
  std::fflush(stdout);
  std::vector<std::unique_ptr<QmoeLayer>> qlayers;  // the distinct layers
  std::vector<const QmoeLayer*> qchain;             // the chain's: layer l is l % distinct
  const Routes routes(97, layers);
  std::vector<float> x0(kHidden);
  uint64_t seed = 0xF00D;
  for (float& v : x0) v = static_cast<float>((splitmix64(seed) >> 11) * 0x1.0p-53 * 2.0 - 1.0);
  std::vector<double> ref;
  double ref_err_q = -1;

  const ggml_backend_buffer_type_t bufts[2] = {g.plain, g.repack};
  for (int b = 0; b < 2; ++b) {
    if (bufts[b] == nullptr) continue;
    ggml_context* wctx = new_meta_context(3 * size_t(distinct), 0, 0);
    std::vector<ggml_tensor*> wd;  // the distinct layers' tensors
    for (int l = 0; l < distinct; ++l) {
      wd.push_back(ggml_new_tensor_3d(wctx, f.type, kHidden, kInter, kExperts));  // gate
      wd.push_back(ggml_new_tensor_3d(wctx, f.type, kHidden, kInter, kExperts));  // up
      wd.push_back(ggml_new_tensor_3d(wctx, f.type, kInter, kHidden, kExperts));  // down
    }
    ggml_backend_buffer_t wbuf = alloc_weights(g, wctx, bufts[b]);
    if (wbuf == nullptr) {
      std::printf("moe   %-6s repack: ggml has no repacked kernel for it here\n", f.name);
      ggml_free(wctx);
      continue;
    }
    for (int l = 0; l < distinct; ++l) {  // the same bytes (same seeds) for every buffer
      const LayerBytes bytes(f, l);
      ggml_backend_tensor_set(wd[3 * l], bytes.gate.data(), 0, bytes.gate.size());
      ggml_backend_tensor_set(wd[3 * l + 1], bytes.up.data(), 0, bytes.up.size());
      ggml_backend_tensor_set(wd[3 * l + 2], bytes.down.data(), 0, bytes.down.size());
      if (qlayers.size() < size_t(distinct)) qlayers.emplace_back(new QmoeLayer(f, bytes));
    }
    // The chain's layers: ggml's graph and libqmoe's loop use layer l % distinct's weights.
    std::vector<ggml_tensor*> w;
    qchain.clear();
    for (int l = 0; l < layers; ++l) {
      for (int j = 0; j < 3; ++j) w.push_back(wd[3 * (l % distinct) + j]);
      qchain.push_back(qlayers[l % distinct].get());
    }
    GgmlChain chain(g, w);

    // Agreement on route 0 (1 thread), and the FP64 chain from the plain buffer's blocks.
    std::vector<float> xq(kHidden), xg(kHidden), h(kHidden);
    {
      QmoeContext qc(1);
      xq = x0;
      qmoe_chain(qc.ctx, qchain, routes, 0, xq.data(), h.data());
      g.set_threads(1);
      chain.run(g, routes, 0, x0.data(), xg.data());
    }
    double ref_err_g = -1;
    if (bufts[b] == g.plain) {
      reference_chain(f, w, routes, 0, x0.data(), ref);
      ref_err_q = rel_err(xq.data(), ref.data(), kHidden);
    }
    if (!ref.empty()) ref_err_g = rel_err(xg.data(), ref.data(), kHidden);
    const double err = rel_err(xq.data(), xg.data(), kHidden);

    for (int t : o.threads) {
      QmoeContext qc(t);
      g.set_threads(t);
      int qr = 0, gr = 0;
      std::vector<float> xin(kHidden), xout(kHidden);
      const auto times = time_pair(
          o.quick ? 2 : o.moe_rounds, o.quick ? 2 : o.moe_tokens,
          [&] {
            xout = x0;
            qmoe_chain(qc.ctx, qchain, routes, qr, xout.data(), h.data());
            qr = (qr + 1) % routes.count;
          },
          [&] {
            chain.run(g, routes, gr, x0.data(), xout.data());
            gr = (gr + 1) % routes.count;
          });
      Row row;
      row.bench = "moe";
      row.format = f.name;
      row.shape = "qwen3_30b_a3b";
      row.ggml_buffer = b == 0 ? "plain" : "repack";
      row.m = 1;
      row.threads = t;
      row.layers = layers;
      row.distinct = distinct;
      row.qmoe_us = times.first;
      row.ggml_us = times.second;
      row.err_vs_ggml = err;
      row.err_qmoe_ref = ref_err_q;
      row.err_ggml_ref = ref_err_g;
      print_row(row);
      g_rows.push_back(row);
    }
    ggml_backend_buffer_free(wbuf);
    ggml_free(wctx);
  }
}

}  // namespace qmoe_ggml
