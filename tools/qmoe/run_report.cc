#include "run_report.h"

#include <algorithm>
#include <cinttypes>
#include <cmath>
#include <string>
#include <vector>

namespace {

// One finished run, as the report reads it.
struct RunRecord {
  const RunOptions& options;
  const RunContext& run;
  const RunModel& model;
  const RunBandwidth& bandwidth;
  const DecodeResult& decode;
  double total_s;
};

// The figures the text and the JSON share, derived once so that both say the same.
struct RunMetrics {
  double step_min_ms, step_median_ms, step_max_ms;
  double token_count, layer_calls;
  double bytes_read, bytes_per_token, step_bytes;  // of weights
  double experts_per_layer_step, experts_per_token;
  double achieved, achieved_end_to_end;  // weight bytes per second
  double ratio, ratio_weights, ratio_best_step;
  double ideal_ms_per_step;  // at the measured bandwidth
  double other_s;            // decode time outside the timed parts: progress, the loop
  double huge_page_bytes;
  double step_over_llc;
};

RunMetrics derive_metrics(const RunRecord& r) {
  const DecodeResult& d = r.decode;
  const double bw_reference = r.bandwidth.reference;
  RunMetrics m;
  std::vector<double> step_ms = d.step_ms;
  std::sort(step_ms.begin(), step_ms.end());
  const size_t mid = step_ms.size() / 2;  // an even count: the mean of the middle two
  m.step_min_ms = step_ms.front();
  m.step_median_ms =
      step_ms.size() % 2 == 1 ? step_ms[mid] : 0.5 * (step_ms[mid - 1] + step_ms[mid]);
  m.step_max_ms = step_ms.back();
  m.token_count = static_cast<double>(r.options.tokens) * r.options.batch;
  m.layer_calls = static_cast<double>(r.options.tokens) * r.options.shape.layers;
  m.bytes_read = static_cast<double>(d.experts_computed) * r.model.expert_bytes.total();
  m.bytes_per_token = m.bytes_read / m.token_count;
  m.step_bytes = m.bytes_read / r.options.tokens;
  m.experts_per_layer_step = d.experts_computed / m.layer_calls;
  m.experts_per_token = d.experts_computed / m.token_count;
  m.achieved = d.moe_s > 0 ? m.bytes_read / d.moe_s : 0.0;
  m.achieved_end_to_end = d.decode_s > 0 ? m.bytes_read / d.decode_s : 0.0;
  m.ratio = bw_reference > 0 ? m.achieved / bw_reference : 0.0;
  m.ratio_weights = r.bandwidth.weights > 0 ? m.achieved / r.bandwidth.weights : 0.0;
  // Over the best step's own layer calls, not the fastest whole step (tool work included)
  // against the mean bytes per step, which could fall below `ratio`.
  m.ratio_best_step = bw_reference > 0 ? d.best_step_bytes_per_s / bw_reference : 0.0;
  m.ideal_ms_per_step = bw_reference > 0 ? m.bytes_read / bw_reference / r.options.tokens * 1e3 : 0;
  m.other_s = std::max(0.0, d.decode_s - d.route_s - d.moe_s - d.tool_s);
  m.huge_page_bytes = weight_bytes_on_huge_pages(r.model);
  const double llc = static_cast<double>(r.bandwidth.llc_bytes);
  m.step_over_llc = r.bandwidth.llc_bytes > 0 ? m.step_bytes / llc : 0.0;
  return m;
}

const char* bandwidth_threads(const RunContext& run) {
  return run.threads > 1 ? "all threads" : "1 thread";
}

// Experts are re-read a step or a few later (each step draws top-k of E per layer afresh);
// unless one step's weights are well above the last-level cache, some of those reads hit the
// cache and flatter the ratio.
void print_cache_note(std::FILE* out, const RunRecord& r, const RunMetrics& m) {
  if (m.step_over_llc >= 2.0) return;
  const double llc = static_cast<double>(r.bandwidth.llc_bytes);
  const double per_layer_step = m.step_bytes / r.options.shape.layers;
  std::fprintf(out,
               "  %-24s a step reads %.0f MB, %.1fx the %.0f MiB last-level cache: some experts "
               "are re-read from the cache (about %u layers make it 2x)\n",
               "note", m.step_bytes * 1e-6, m.step_over_llc, llc / (1 << 20),
               static_cast<unsigned>(std::ceil(2.0 * llc / per_layer_step)));
}

void print_results(std::FILE* out, const RunRecord& r, const RunMetrics& m) {
  const RunOptions& o = r.options;
  const DecodeResult& d = r.decode;
  const RunBandwidth& bw = r.bandwidth;
  std::fprintf(out, "\nResults (%u timed steps after 1 warm-up step)\n", o.tokens);
  if (r.model.mapped) {
    std::fprintf(out, "  %-24s %.2f s from %s (mapped read-only: the page cache holds them)\n",
                 "weights mapped", r.model.store_read_s, o.store);
  } else if (r.model.from_store) {
    std::fprintf(
        out, "  %-24s %.2f s from %s (%.2f GB/s on %u threads, CRC-32C checked)\n",
        "weights loaded", r.model.store_read_s, o.store,
        r.model.store_read_s > 0 ? r.model.weight_bytes_total / r.model.store_read_s * 1e-9 : 0.0,
        r.model.store_read_threads);
  } else {
    std::fprintf(out, "  %-24s %.2f s (%u threads)\n", "weight generation", r.model.generate_s,
                 r.model.generate_threads);
  }
  if (o.write_store != nullptr) {
    std::fprintf(out, "  %-24s %.2f s to %s\n", "expert store written", r.model.store_write_s,
                 o.write_store);
  }
  std::fprintf(out, "  %-24s %.0f of %.0f MiB of weights on huge pages\n", "weight memory",
               m.huge_page_bytes / (1 << 20), r.model.weight_bytes_total / (1 << 20));
  std::fprintf(out, "  %-24s %.2f s\n", "bandwidth measurement", bw.seconds);
  std::fprintf(out, "  %-24s %.3f s\n", "decode", d.decode_s);
  std::fprintf(out, "  %-24s %.3f ms per step, %.3f ms per token\n", "latency",
               d.decode_s * 1e3 / o.tokens, d.decode_s * 1e3 / m.token_count);
  std::fprintf(out, "  %-24s %.3f ms per layer (moe_forward only)\n", "layer",
               d.moe_s * 1e3 / m.layer_calls);
  std::fprintf(out, "  %-24s min %.3f, median %.3f, max %.3f ms (spread = host noise)\n",
               "step time", m.step_min_ms, m.step_median_ms, m.step_max_ms);
  std::fprintf(out, "  %-24s %.2f per layer-step, %.2f per token (%u layers x top-%u = %u)\n",
               "experts computed", m.experts_per_layer_step, m.experts_per_token, o.shape.layers,
               o.shape.top_k, o.shape.layers * o.shape.top_k);
  std::fprintf(out, "  %-24s %.2f MB per token, %.2f MB per step\n", "weights read",
               m.bytes_per_token * 1e-6, m.bytes_read / o.tokens * 1e-6);
  std::fprintf(out, "  %-24s %.2f GB/s in moe_forward, %.2f GB/s end to end\n", "achieved",
               m.achieved * 1e-9, m.achieved_end_to_end * 1e-9);
  std::fprintf(out, "  %-24s %.2f GB/s (%s)\n", "measured read bandwidth", bw.reference * 1e-9,
               bandwidth_threads(r.run));
  std::fprintf(out, "  %-24s %.2f of measured bandwidth (bandwidth-bound ideal %.3f ms/step)\n",
               "ratio", m.ratio, m.ideal_ms_per_step);
  std::fprintf(out, "  %-24s %.2f (the same over the step the least host noise hit)\n",
               "ratio, best step", m.ratio_best_step);
  print_cache_note(out, r, m);
  if (r.model.mapped) {
    std::fprintf(out, "  %-24s not measured (the weights are the store's file, mapped)\n",
                 "weights' read bandwidth");
    return;
  }
  std::fprintf(out, "  %-24s %.2f GB/s over the first %u layers' weights (%.0f MiB, %s)\n",
               "weights' read bandwidth", bw.weights * 1e-9, bw.weights_layers,
               static_cast<double>(bw.weights_bytes) / (1 << 20), bandwidth_threads(r.run));
  std::fprintf(out, "  %-24s %.2f of the weights' read bandwidth (the pages the decode reads)\n",
               "ratio, weights' pages", m.ratio_weights);
}

void print_time_split(std::FILE* out, const RunRecord& r, const RunMetrics& m) {
  const DecodeResult& d = r.decode;
  std::fprintf(out, "  Where decode time went\n");
  const double pct = d.decode_s > 0 ? 100.0 / d.decode_s : 0.0;
  std::fprintf(out, "    %-22s %9.3f ms %5.1f%%\n", "moe_forward", d.moe_s * 1e3, d.moe_s * pct);
  std::fprintf(out, "    %-22s %9.3f ms %5.1f%%\n", "route_topk", d.route_s * 1e3, d.route_s * pct);
  std::fprintf(out, "    %-22s %9.3f ms %5.1f%%\n", "tool (logits, rms, acct)", d.tool_s * 1e3,
               d.tool_s * pct);
  std::fprintf(out, "    %-22s %9.3f ms %5.1f%%\n", "other (progress, loop)", m.other_s * 1e3,
               m.other_s * pct);
  std::fprintf(out, "  %-24s %016" PRIx64 " (max |x| %.3g%s)\n", "hidden-state checksum",
               d.checksum, d.max_abs_x, d.finite ? "" : ", NOT FINITE");
  std::fprintf(out, "  %-24s %.2f s\n", "total", r.total_s);
}

// The global scale as a JSON value: the number, or null for a format without one.
std::string global_scale_json(const RunFormat& format) {
  return json_number(format.global_scale != 0.0f, "%.9g", format.global_scale);
}

// A SwiGLU limit for JSON: a number, or null for none (+infinity is not JSON).
std::string limit_json(float limit) {
  return json_number(std::isfinite(limit), "%.9g", limit);
}

void print_json(const RunRecord& r, const RunMetrics& m) {
  const RunOptions& o = r.options;
  const ModelShape& shape = o.shape;
  const RunFormat& format = run_format(shape.format);
  const RunContext& run = r.run;
  const RunBandwidth& bw = r.bandwidth;
  const DecodeResult& d = r.decode;
  std::printf(
      "{\"command\": \"run\", \"library_version\": \"%s\",\n"
      " \"cpu\": \"%s\", \"tier\": \"%s\", \"threads\": %u,\n"
      " \"accuracy\": \"%s\", \"activations\": \"%s\", \"gemm_kernel\": \"%s\", "
      "\"quantize_kernel\": \"%s\",\n"
      " \"model\": {\"name\": \"%s\", \"layers\": %u, \"experts\": %u, \"top_k\": %u, "
      "\"hidden\": %u, \"intermediate\": %u, \"swiglu_alpha\": %g, \"swiglu_beta\": %g, "
      "\"swiglu_limit\": %s, \"format\": \"%s\", \"block_size\": %u, \"scale_dtype\": "
      "\"%s\", \"global_scale\": %s, \"bytes_per_expert\": %zu, \"weight_bytes_total\": %.0f, "
      "\"weight_bytes_on_huge_pages\": %.0f},\n"
      " \"decode\": {\"steps\": %u, \"batch\": %u, \"seed\": %" PRIu64
      ", \"routing\": \"%s\", \"warmup_steps\": 1},\n"
      " \"bandwidth\": {\"buffer_bytes\": %zu, \"one_thread_gbps\": %.3f, "
      "\"all_threads_gbps\": %.3f, \"reference_gbps\": %.3f, \"weights_gbps\": %.3f, "
      "\"weights_bytes_measured\": %zu},\n"
      " \"timing\": {\"generate_s\": %.4f, \"store_read_s\": %.4f, \"store_write_s\": %.4f, "
      "\"bandwidth_s\": %.4f, \"decode_s\": %.6f, "
      "\"moe_forward_s\": %.6f, \"route_s\": %.6f, \"tool_s\": %.6f, \"other_s\": %.6f, "
      "\"ms_per_step\": %.4f, \"step_min_ms\": %.4f, \"step_median_ms\": %.4f, \"step_max_ms\": "
      "%.4f, \"ms_per_token\": %.4f, \"ms_per_layer\": %.4f, "
      "\"total_s\": %.3f},\n"
      " \"experts_computed\": %" PRIu64
      ", \"experts_per_token\": %.3f, \"experts_per_layer_step\": %.3f,\n"
      " \"weight_bytes_read\": %.0f, \"weight_bytes_per_token\": %.0f,\n"
      " \"achieved_gbps\": %.3f, \"achieved_end_to_end_gbps\": %.3f, \"bandwidth_ratio\": "
      "%.4f, \"weights_bandwidth_ratio\": %.4f,\n"
      " \"bandwidth_ratio_best_step\": %.4f, \"step_weights_over_llc\": %.3f,\n"
      " \"checksum\": \"%016" PRIx64 "\", \"max_abs_x\": %.6g, \"finite\": %s}\n",
      qmoe_version_string(), json_escape(run.host.cpu_brand).c_str(), qmoe_isa_name(run.tier),
      run.threads, accuracy_name(o.accuracy), activations_name(o.activations), run.gemm_kernel,
      run.quantize_kernel, shape.model, shape.layers, shape.experts, shape.top_k, shape.hidden,
      shape.intermediate, static_cast<double>(shape.swiglu_alpha),
      static_cast<double>(shape.swiglu_beta), limit_json(shape.swiglu_limit).c_str(), format.name,
      format.block_size, format.scale_name, global_scale_json(format).c_str(),
      r.model.expert_bytes.total(), r.model.weight_bytes_total, m.huge_page_bytes, o.tokens,
      o.batch, o.seed, routing_name(o.routing), bw.buffer_bytes, bw.one_thread * 1e-9,
      bw.all_threads * 1e-9, bw.reference * 1e-9, bw.weights * 1e-9, bw.weights_bytes,
      r.model.generate_s, r.model.store_read_s, r.model.store_write_s, bw.seconds, d.decode_s,
      d.moe_s, d.route_s, d.tool_s, m.other_s, d.decode_s * 1e3 / o.tokens, m.step_min_ms,
      m.step_median_ms, m.step_max_ms, d.decode_s * 1e3 / m.token_count,
      d.moe_s * 1e3 / m.layer_calls, r.total_s, d.experts_computed, m.experts_per_token,
      m.experts_per_layer_step, m.bytes_read, m.bytes_per_token, m.achieved * 1e-9,
      m.achieved_end_to_end * 1e-9, m.ratio, m.ratio_weights, m.ratio_best_step, m.step_over_llc,
      d.checksum, d.max_abs_x, d.finite ? "true" : "false");
}

}  // namespace

std::string json_number(bool known, const char* format, double value) {
  if (!known) return "null";
  char text[64];
  std::snprintf(text, sizeof text, format, value);
  return text;
}

std::string json_escape(const char* text) {
  std::string out;
  for (const char* p = text; *p; ++p) {
    if (*p == '"' || *p == '\\') out += '\\';
    if (static_cast<unsigned char>(*p) >= 0x20) out += *p;
  }
  return out;
}

void print_run_header(std::FILE* out, const RunOptions& options, const RunContext& run,
                      const RunModel& model) {
  const ModelShape& shape = options.shape;
  const ExpertBytes& eb = model.expert_bytes;
  std::fprintf(out, "qmoe run: libqmoe %s, synthetic %s-shaped MoE decode\n", qmoe_version_string(),
               shape.title);
  std::fprintf(out, "  %-24s %s\n", "cpu",
               run.host.cpu_brand[0] ? run.host.cpu_brand : "(unknown)");
  std::fprintf(out, "  %-24s %s (best supported %s)\n", "tier", qmoe_isa_name(run.tier),
               qmoe_isa_name(run.host.best_supported_isa));
  std::fprintf(out, "  %-24s %u\n", "threads", run.threads);
  std::fprintf(out, "  %-24s %s: %s\n", "gemm kernel", accuracy_name(options.accuracy),
               run.gemm_kernel);
  if (options.accuracy == QMOE_ACCURACY_FAST)
    std::fprintf(out, "  %-24s %s\n", "activation quantizer", run.quantize_kernel);
  std::fprintf(out, "  %-24s %s hidden state in and out of each layer\n", "activations",
               activations_name(options.activations));
  const RunFormat& format = run_format(shape.format);
  const std::string clamp =
      std::isfinite(shape.swiglu_limit) ? "clamp " + limit_json(shape.swiglu_limit) : "no clamp";
  std::string global;
  if (format.global_scale != 0.0f) {
    global = " and global scale " + global_scale_json(format);
  }
  std::fprintf(out,
               "  %-24s %s: %u layers x %u experts (top-%u), hidden %u, intermediate %u, "
               "SwiGLU alpha %g, up + %g, %s\n"
               "  %-24s %s block %u, %s scales in the grouped order (K/%u x 8 per row "
               "group)%s, no zero points, swiglu interleaved\n",
               "model", shape.model, shape.layers, shape.experts, shape.top_k, shape.hidden,
               shape.intermediate, static_cast<double>(shape.swiglu_alpha),
               static_cast<double>(shape.swiglu_beta), clamp.c_str(), "weights", format.title,
               format.block_size, format.scale_title, format.block_size, global.c_str());
  std::fprintf(out, "  %-24s %.2f MB (fc1 %zu + %zu, fc2 %zu + %zu bytes of codes + scales)\n",
               "bytes per expert", eb.total() * 1e-6, eb.fc1_codes, eb.fc1_scales, eb.fc2_codes,
               eb.fc2_scales);
  std::fprintf(out, "  %-24s %.2f GB\n", "weights in total", model.weight_bytes_total * 1e-9);
  std::fprintf(out, "  %-24s %u steps x batch %u, seed %" PRIu64 ", %s routing\n", "decode",
               options.tokens, options.batch, options.seed, routing_name(options.routing));
  std::fflush(out);
}

void print_buffer_bandwidth(std::FILE* out, const RunContext& run, const RunBandwidth& bandwidth) {
  std::fprintf(out, "  %-24s 1 thread %.1f GB/s, all threads (%u) %.1f GB/s (%zu MiB buffer, %s)\n",
               "read bandwidth", bandwidth.one_thread * 1e-9, run.threads,
               bandwidth.all_threads * 1e-9, bandwidth.buffer_bytes >> 20, run.bandwidth_kernel);
  std::fflush(out);
}

void print_run_report(std::FILE* out, const RunOptions& options, const RunContext& run,
                      const RunModel& model, const RunBandwidth& bandwidth,
                      const DecodeResult& decode, double total_s) {
  const RunRecord record{options, run, model, bandwidth, decode, total_s};
  const RunMetrics metrics = derive_metrics(record);
  print_results(out, record, metrics);
  print_time_split(out, record, metrics);
  std::fflush(out);
  if (options.json) print_json(record, metrics);
}
