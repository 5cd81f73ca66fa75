// compare_ggml: libqmoe against ggml's CPU backend in one process, on the same bytes (issue 21).
//
// Weights are generated once as ggml blocks (block_q4_0: FP16 d + 16 bytes; block_mxfp4: E8M0
// e + 16 bytes), handed to ggml as they are (its plain CPU buffer, and its repacked CPU_REPACK
// buffer where this ggml repacks the type on this CPU), and imported into libqmoe with
// qmoe_import_int4_q4_0 / qmoe_import_mxfp4_ggml (scales regrouped once with qmoe_group_plane,
// as a runtime does at load time). Two comparisons:
//
//   gemv: one expert projection, ggml_mul_mat in a one-node graph against qmoe_gemm (fast
//         level: both quantize the activations to int8 per 32 k), M = 1 and 4, weights cold
//         (each side rotates over its own pool of matrices of at least 4 x the L3, as
//         benchmarks/gemm does).
//   moe:  a chain of Qwen3-30B-A3B MoE layers (128 experts, top-8, hidden 2048, expert 768),
//         M = 1 decode, built as llama.cpp's build_moe_ffn builds it (ggml_mul_mat_id for
//         gate, up and down, ggml_swiglu_split, ggml_mul by the routing weights, the experts'
//         views summed with ggml_add) against qmoe_moe_forward over the same bytes and the same
//         routing. Each layer is x += moe(rms_norm(x)) on both sides, so that a long chain
//         neither overflows nor vanishes (the norm and the add are a few microseconds).
//
// Time is measured per side in blocks that alternate within one process (the sides' thread
// pools are left 20 ms to park between blocks); a figure is the median of all timed calls, and
// ratio = qmoe time / ggml time (below 1: libqmoe is faster). Before timing, the outputs of
// the two sides are compared with each other and with an FP64 reference on the dequantized
// weights: max |a - b| / max |b|.
#include "compare_ggml_common.h"

namespace qmoe_ggml {
namespace {

// --- GEMV -------------------------------------------------------------------------------------

struct Shape {
  const char* name;
  uint32_t n, k;
};

void run_gemv(const Options& o, Ggml& g, const Format& f, const Shape& s, size_t llc_bytes) {
  const size_t src_bytes = size_t{s.n} * row_bytes(f, s.k);
  const size_t pool = std::max<size_t>(2, (4 * llc_bytes + src_bytes - 1) / src_bytes);
  const int max_m = 4;

  // libqmoe's pool.
  const size_t slot = align64(qmoe_matrix_bytes(f, s.n, s.k));
  WeightMemory qmem(slot * pool);
  std::vector<qmoe_quant_matrix> qw(pool);

  // ggml's pools: a context of weight tensors per buffer type, one graph per matrix and M.
  const ggml_backend_buffer_type_t bufts[2] = {g.plain, g.repack};
  ggml_context* wctx[2] = {nullptr, nullptr};
  ggml_backend_buffer_t wbuf[2] = {nullptr, nullptr};
  std::vector<ggml_tensor*> wt[2];
  for (int b = 0; b < 2; ++b) {
    if (bufts[b] == nullptr) continue;
    wctx[b] = new_meta_context(pool, 0, 0);
    for (size_t i = 0; i < pool; ++i)
      wt[b].push_back(ggml_new_tensor_2d(wctx[b], f.type, s.k, s.n));
    wbuf[b] = alloc_weights(g, wctx[b], bufts[b]);
  }

  std::vector<uint8_t> src(src_bytes);
  std::vector<uint8_t> first(src_bytes);  // matrix 0, for the reference
  for (size_t i = 0; i < pool; ++i) {
    fill_blocks(f, src_bytes / f.block_bytes, 0x5EED0000ull + i * 7919 + s.n * 31 + s.k,
                src.data());
    if (i == 0) first = src;
    qw[i] = import_matrix(f, s.n, s.k, src.data(), s.n, nullptr, qmem.bytes() + i * slot);
    for (int b = 0; b < 2; ++b) {
      if (wbuf[b] != nullptr) ggml_backend_tensor_set(wt[b][i], src.data(), 0, src_bytes);
    }
  }

  // Activations: the same M x K floats for both sides.
  std::vector<float> x(size_t{max_m} * s.k);
  uint64_t seed = 0xAC71;
  for (float& v : x) v = static_cast<float>((splitmix64(seed) >> 11) * 0x1.0p-53 * 2.0 - 1.0);

  for (int b = 0; b < 2; ++b) {
    if (bufts[b] == nullptr) continue;
    if (wbuf[b] == nullptr) {
      std::printf("gemv  %-6s %-12s repack: ggml has no repacked kernel for it here\n", f.name,
                  s.name);
      continue;
    }
    for (int m : {1, max_m}) {
      // Graph context: x [K, M], one output and one graph per matrix.
      ggml_context* gctx = new_meta_context(pool + 1, 4, pool);
      ggml_tensor* xt = ggml_new_tensor_2d(gctx, GGML_TYPE_F32, s.k, m);
      std::vector<ggml_cgraph*> graphs(pool);
      std::vector<ggml_tensor*> outs(pool);
      for (size_t i = 0; i < pool; ++i) {
        outs[i] = ggml_mul_mat(gctx, wt[b][i], xt);
        graphs[i] = ggml_new_graph_custom(gctx, 4, false);
        ggml_build_forward_expand(graphs[i], outs[i]);
      }
      ggml_backend_buffer_t gbuf = ggml_backend_alloc_ctx_tensors(gctx, g.backend);
      ggml_backend_tensor_set(xt, x.data(), 0, sizeof(float) * s.k * m);

      // Agreement on matrix 0, M rows.
      std::vector<float> yq(static_cast<size_t>(m) * s.n), yg(static_cast<size_t>(m) * s.n);
      std::vector<double> ref(static_cast<size_t>(m) * s.n), wrow(s.k);
      for (uint32_t n = 0; n < s.n; ++n) {
        dequantize_row(f, first.data() + n * row_bytes(f, s.k), s.k, wrow.data());
        for (int r = 0; r < m; ++r) {
          double acc = 0;
          for (uint32_t kk = 0; kk < s.k; ++kk)
            acc += wrow[kk] * x[static_cast<size_t>(r) * s.k + kk];
          ref[static_cast<size_t>(r) * s.n + n] = acc;
        }
      }
      g.set_threads(1);
      g.compute(graphs[0]);
      ggml_backend_tensor_get(outs[0], yg.data(), 0, sizeof(float) * yg.size());

      for (int t : o.threads) {
        QmoeContext qc(t);
        check(
            qmoe_gemm(qc.ctx, &qw[0], QMOE_ACCURACY_FAST, m, x.data(), s.k, yq.data(), s.n, 0, s.n),
            "qmoe_gemm");
        g.set_threads(t);
        size_t qi = 0, gi = 0;
        const int calls = o.quick ? 8 : static_cast<int>(pool);
        const auto times = time_pair(
            o.quick ? 3 : o.rounds, calls,
            [&] {
              check(qmoe_gemm(qc.ctx, &qw[qi], QMOE_ACCURACY_FAST, m, x.data(), s.k, yq.data(), s.n,
                              0, s.n),
                    "qmoe_gemm");
              qi = qi + 1 == pool ? 0 : qi + 1;
            },
            [&] {
              g.compute(graphs[gi]);
              gi = gi + 1 == pool ? 0 : gi + 1;
            });
        Row row;
        row.bench = "gemv";
        row.format = f.name;
        row.shape = s.name;
        row.ggml_buffer = b == 0 ? "plain" : "repack";
        row.m = m;
        row.threads = t;
        row.qmoe_us = times.first;
        row.ggml_us = times.second;
        // Agreement: qmoe on matrix 0 against ggml on matrix 0 and the FP64 reference.
        check(
            qmoe_gemm(qc.ctx, &qw[0], QMOE_ACCURACY_FAST, m, x.data(), s.k, yq.data(), s.n, 0, s.n),
            "qmoe_gemm");
        row.err_vs_ggml = rel_err(yq.data(), yg.data(), yq.size());
        row.err_qmoe_ref = rel_err(yq.data(), ref.data(), ref.size());
        row.err_ggml_ref = rel_err(yg.data(), ref.data(), ref.size());
        print_row(row);
        g_rows.push_back(row);
      }
      ggml_backend_buffer_free(gbuf);
      ggml_free(gctx);
    }
  }
  for (int b = 0; b < 2; ++b) {
    if (wbuf[b] != nullptr) ggml_backend_buffer_free(wbuf[b]);
    if (wctx[b] != nullptr) ggml_free(wctx[b]);
  }
}

// --- Main ------------------------------------------------------------------------------------

std::vector<int> parse_list(const char* s) {
  std::vector<int> v;
  for (const char* p = s; *p;) {
    char* end = nullptr;
    const long n = std::strtol(p, &end, 10);
    if (end == p || n < 1) die(std::string("bad thread list: ") + s);
    v.push_back(static_cast<int>(n));
    p = *end == ',' ? end + 1 : end;
    if (*end != ',' && *end != '\0') die(std::string("bad thread list: ") + s);
  }
  return v;
}

Options parse(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto value = [&]() -> const char* {
      if (i + 1 >= argc) die("missing value after " + a);
      return argv[++i];
    };
    if (a == "--threads") {
      o.threads = parse_list(value());
    } else if (a == "--rounds") {
      o.rounds = std::max(1, std::atoi(value()));
    } else if (a == "--moe-rounds") {
      o.moe_rounds = std::max(1, std::atoi(value()));
    } else if (a == "--tokens") {
      o.moe_tokens = std::max(1, std::atoi(value()));
    } else if (a == "--layers") {
      o.layers = std::max(1, std::atoi(value()));
    } else if (a == "--distinct") {
      o.distinct = std::max(0, std::atoi(value()));
    } else if (a == "--only") {
      const std::string w = value();
      o.gemv = w == "gemv";
      o.moe = w == "moe";
      if (!o.gemv && !o.moe) die("--only takes gemv or moe");
    } else if (a == "--no-moe-mxfp4") {
      o.moe_mxfp4 = false;
    } else if (a == "--ggml-pages") {
      const std::string w = value();
      if (w != "huge" && w != "4k") die("--ggml-pages takes huge or 4k");
      o.ggml_huge_pages = w == "huge";
    } else if (a == "--quick") {
      o.quick = true;
    } else if (a == "--json") {
      o.json_path = value();
    } else {
      std::printf(
          "usage: compare_ggml [--threads 1,2] [--rounds 7] [--layers 16] [--distinct N]\n"
          "                    [--tokens 8]\n"
          "                    [--moe-rounds 5] [--only gemv|moe] [--no-moe-mxfp4]\n"
          "                    [--ggml-pages huge|4k] [--quick] [--json FILE]\n");
      std::exit(a == "--help" ? 0 : 2);
    }
  }
  return o;
}

void write_json(const Options& o, const std::string& header) {
  FILE* out = std::fopen(o.json_path.c_str(), "w");
  if (out == nullptr) die("cannot write " + o.json_path);
  std::fprintf(out, "{\n  \"context\": {%s},\n  \"rows\": [\n", header.c_str());
  for (size_t i = 0; i < g_rows.size(); ++i) {
    const Row& r = g_rows[i];
    std::fprintf(out,
                 "    {\"bench\": \"%s\", \"format\": \"%s\", \"shape\": \"%s\", \"ggml_buffer\": "
                 "\"%s\", \"m\": %d, \"threads\": %d, \"layers\": %d, \"distinct_layers\": %d, "
                 "\"qmoe_us\": %.3f, "
                 "\"ggml_us\": %.3f, \"ratio\": %.5f, \"err_qmoe_vs_ggml\": %.3e, "
                 "\"err_qmoe_vs_fp64\": %.3e, \"err_ggml_vs_fp64\": %.3e}%s\n",
                 r.bench.c_str(), r.format.c_str(), r.shape.c_str(), r.ggml_buffer.c_str(), r.m,
                 r.threads, r.layers, r.distinct, r.qmoe_us, r.ggml_us, r.qmoe_us / r.ggml_us,
                 r.err_vs_ggml, r.err_qmoe_ref, r.err_ggml_ref, i + 1 < g_rows.size() ? "," : "");
  }
  std::fprintf(out, "  ]\n}\n");
  std::fclose(out);
}

void quiet_ggml_log(ggml_log_level level, const char* text, void*) {
  if (level >= GGML_LOG_LEVEL_WARN) std::fputs(text, stderr);
}

}  // namespace
}  // namespace qmoe_ggml

using namespace qmoe_ggml;  // NOLINT: the program's own namespace

int main(int argc, char** argv) {
  Options o = parse(argc, argv);
  ggml_log_set(quiet_ggml_log, nullptr);
  qmoe_host_info info{};
  info.struct_size = sizeof(info);
  check(qmoe_get_host_info(&info), "qmoe_get_host_info");
  if (o.threads.empty()) {
    o.threads.push_back(1);
    const int all = static_cast<int>(std::max<uint32_t>(1, info.physical_cores));
    if (all > 1) o.threads.push_back(all);
  }
  const size_t llc = info.l3_cache_bytes != 0 ? size_t{info.l3_cache_bytes} *
                                                    std::max<uint32_t>(1, info.l3_cache_instances)
                                              : size_t{32} << 20;

  Ggml g(o.ggml_huge_pages);
  QmoeContext probe(1);
  qmoe_isa isa = QMOE_ISA_DEFAULT;
  check(qmoe_context_get_isa(probe.ctx, &isa), "qmoe_context_get_isa");
  const char* k_int4 = nullptr;
  const char* k_mxfp4 = nullptr;
  int available = 0;
  check(qmoe_gemm_kernel_available(probe.ctx, QMOE_WEIGHT_FORMAT_INT4, 32, QMOE_ACCURACY_FAST,
                                   &available, &k_int4),
        "kernel");
  check(qmoe_gemm_kernel_available(probe.ctx, QMOE_WEIGHT_FORMAT_MXFP4, 32, QMOE_ACCURACY_FAST,
                                   &available, &k_mxfp4),
        "kernel");
  char header[1024];
  std::snprintf(header, sizeof(header),
                "\"cpu\": \"%s\", \"qmoe_version\": \"%s\", \"qmoe_tier\": \"%s\", "
                "\"qmoe_int4_kernel\": \"%s\", \"qmoe_mxfp4_kernel\": \"%s\", "
                "\"ggml_version\": \"%s\", \"ggml_commit\": \"%s\", \"ggml_avx512\": %d, "
                "\"ggml_avx512_vnni\": %d, \"ggml_repack\": %d, \"ggml_huge_pages\": %d, "
                "\"llc_bytes\": %zu, \"moe_layers\": %d",
                info.cpu_brand, qmoe_version_string(), qmoe_isa_name(isa), k_int4 ? k_int4 : "none",
                k_mxfp4 ? k_mxfp4 : "none", ggml_version(), ggml_commit(), ggml_cpu_has_avx512(),
                ggml_cpu_has_avx512_vnni(), g.repack != nullptr, o.ggml_huge_pages ? 1 : 0, llc,
                o.layers);
  std::printf("{%s}\n", header);
  std::printf("ratio = qmoe time / ggml time (below 1: libqmoe faster); qmoe at the fast level\n");

  if (o.gemv) {
    run_gemv(o, g, kQ4_0, {"qwen3_fc1", 2 * kInter, kHidden}, llc);
    run_gemv(o, g, kQ4_0, {"qwen3_fc2", kHidden, kInter}, llc);
    run_gemv(o, g, kMxfp4, {"qwen3_fc1", 2 * kInter, kHidden}, llc);
    run_gemv(o, g, kMxfp4, {"gptoss_fc1", 5760, 2880}, llc);
  }
  if (o.moe) {
    run_moe(o, g, kQ4_0);
    if (o.moe_mxfp4) run_moe(o, g, kMxfp4);
  }
  if (!o.json_path.empty()) write_json(o, header);
  return 0;
}
