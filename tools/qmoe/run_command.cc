// `qmoe run`: a MoE decode end to end on the CPU with a synthetic model of the Qwen3-30B-A3B
// shape, through the public C ABI only. Prints what a performance engineer wants to see.

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cinttypes>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "commands.h"
#include "memory_limit.h"
#include "progress.h"
#include "qmoe/qmoe.h"
#include "synthetic_model.h"

namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

struct RunOptions {
  ModelShape shape;
  uint32_t tokens = 64;
  uint32_t batch = 1;
  qmoe_accuracy accuracy = QMOE_ACCURACY_FAST;
  qmoe_dtype activations = QMOE_DTYPE_F32;  // of the hidden state x, in and out of each layer
  qmoe_isa isa = QMOE_ISA_DEFAULT;
  uint32_t threads = 0;
  uint64_t seed = 1;
  bool json = false;
};

void print_usage(std::FILE* out) {
  std::fprintf(
      out,
      "usage: qmoe run [options]\n"
      "\n"
      "Decode with a synthetic MoE model of the Qwen3-30B-A3B shape (128 experts a layer,\n"
      "top-8, hidden 2048, expert intermediate 768, INT4 block 32 with FP16 scales), weights\n"
      "generated from --seed, router logits drawn per token. Each of the --tokens steps runs\n"
      "--batch tokens through every layer: x += moe(x), then x is rescaled to unit RMS.\n"
      "\n"
      "options:\n"
      "  --layers N            MoE layers (default 4; 48 is the full depth, ~16 GB)\n"
      "  --tokens T            decode steps (default 64)\n"
      "  --batch M             tokens per step (default 1)\n"
      "  --format int4         weight format (only int4)\n"
      "  --accuracy exact|fast dequant-GEMM level (default fast)\n"
      "  --activations f32|f16|bf16  type of the hidden state each layer reads and writes\n"
      "                        (default f32; f16/bf16 use qmoe_moe_forward_typed)\n"
      "  --isa scalar|avx2|avx512  highest tier (default: the process default)\n"
      "  --threads N           threads, at most 1024 (default 0 = one per physical core)\n"
      "  --seed S              seed of weights and router logits (default 1)\n"
      "  --json                JSON summary on stdout, human report on stderr\n"
      "  --help                this text\n");
}

// Decimal digits only: no sign, no spaces, no 0x or leading-0 octal (strtoull's base 0 read
// "010" as 8 and " -1" as 2^64 - 1).
bool parse_u64(const char* text, uint64_t* value) {
  if (text == nullptr || *text == '\0') return false;
  for (const char* c = text; *c != '\0'; ++c) {
    if (*c < '0' || *c > '9') return false;
  }
  char* end = nullptr;
  errno = 0;
  const unsigned long long parsed = std::strtoull(text, &end, 10);
  if (errno != 0 || *end != '\0') return false;
  *value = parsed;
  return true;
}

bool parse_u32(const char* text, uint32_t min, uint32_t max, uint32_t* value) {
  uint64_t parsed = 0;
  if (!parse_u64(text, &parsed) || parsed < min || parsed > max) return false;
  *value = static_cast<uint32_t>(parsed);
  return true;
}

// 0: parsed; otherwise the exit code (0 for --help, 2 for a bad option). --help anywhere wins
// over the other arguments, whatever their order; an option given twice is an error rather
// than the last one silently winning.
int parse_options(int argc, char** argv, RunOptions* o, bool* help) {
  for (int i = 0; i < argc; ++i) {
    if (std::strcmp(argv[i], "--help") == 0 || std::strcmp(argv[i], "-h") == 0) {
      *help = true;
      return 0;
    }
  }
  std::set<std::string> seen;
  for (int i = 0; i < argc; ++i) {
    const char* arg = argv[i];
    const char* value = i + 1 < argc ? argv[i + 1] : nullptr;
    auto bad = [&](const char* what) {
      std::fprintf(stderr, "qmoe run: %s %s\n\n", arg, what);
      print_usage(stderr);
      return 2;
    };
    if (std::strncmp(arg, "--", 2) == 0 && !seen.insert(arg).second) return bad("is given twice");
    if (std::strcmp(arg, "--json") == 0) {
      o->json = true;
      continue;
    }
    if (std::strcmp(arg, "--layers") == 0) {
      if (!parse_u32(value, 1, 100000, &o->shape.layers)) return bad("takes a count >= 1");
    } else if (std::strcmp(arg, "--tokens") == 0) {
      if (!parse_u32(value, 1, 100000000, &o->tokens)) return bad("takes a count >= 1");
    } else if (std::strcmp(arg, "--batch") == 0) {
      if (!parse_u32(value, 1, 65536, &o->batch)) return bad("takes a count in [1, 65536]");
    } else if (std::strcmp(arg, "--threads") == 0) {
      static_assert(QMOE_MAX_THREADS == 1024u, "the message below names the limit");
      if (!parse_u32(value, 0, QMOE_MAX_THREADS, &o->threads)) {
        return bad("takes a count in [0, 1024] (0 = one per core)");
      }
    } else if (std::strcmp(arg, "--seed") == 0) {
      if (!parse_u64(value, &o->seed)) return bad("takes an unsigned integer");
    } else if (std::strcmp(arg, "--format") == 0) {
      if (value == nullptr || std::strcmp(value, "int4") != 0) return bad("takes int4");
    } else if (std::strcmp(arg, "--accuracy") == 0) {
      if (value != nullptr && std::strcmp(value, "exact") == 0) {
        o->accuracy = QMOE_ACCURACY_EXACT;
      } else if (value != nullptr && std::strcmp(value, "fast") == 0) {
        o->accuracy = QMOE_ACCURACY_FAST;
      } else {
        return bad("takes exact or fast");
      }
    } else if (std::strcmp(arg, "--activations") == 0) {
      const char* names[] = {"f32", "f16", "bf16"};
      const qmoe_dtype types[] = {QMOE_DTYPE_F32, QMOE_DTYPE_F16, QMOE_DTYPE_BF16};
      bool found = false;
      for (int t = 0; t < 3; ++t) {
        if (value != nullptr && std::strcmp(value, names[t]) == 0) {
          o->activations = types[t];
          found = true;
        }
      }
      if (!found) return bad("takes f32, f16 or bf16");
    } else if (std::strcmp(arg, "--isa") == 0) {
      bool found = false;
      for (qmoe_isa isa : {QMOE_ISA_SCALAR, QMOE_ISA_AVX2, QMOE_ISA_AVX512}) {
        if (value != nullptr && std::strcmp(value, qmoe_isa_name(isa)) == 0) {
          o->isa = isa;
          found = true;
        }
      }
      if (!found) return bad("takes scalar, avx2 or avx512");
    } else {
      std::fprintf(stderr, "qmoe run: unknown option '%s'\n\n", arg);
      print_usage(stderr);
      return 2;
    }
    ++i;  // the option's value
  }
  return 0;
}

// Every qmoe call is checked; the library's one-line message names the function.
int fail(qmoe_status status) {
  std::fprintf(stderr, "\nqmoe run: %s (%s)\n", qmoe_last_error_message(),
               qmoe_status_string(status));
  return 1;
}

#define QMOE_CHECK(call)                                                       \
  do {                                                                         \
    const qmoe_status qmoe_check_status_ = (call);                             \
    if (qmoe_check_status_ != QMOE_STATUS_OK) return fail(qmoe_check_status_); \
  } while (0)

struct ContextDeleter {
  void operator()(qmoe_context* c) const { qmoe_context_destroy(c); }
};

// Scales each row of x (rows of h floats) to unit RMS.
void rms_normalize(float* x, uint32_t rows, uint32_t h) {
  for (uint32_t r = 0; r < rows; ++r) {
    float* row = x + size_t{r} * h;
    double sum = 0.0;
    for (uint32_t i = 0; i < h; ++i) sum += double{row[i]} * row[i];
    const float scale = sum > 0.0 ? static_cast<float>(1.0 / std::sqrt(sum / h)) : 1.0f;
    for (uint32_t i = 0; i < h; ++i) row[i] *= scale;
  }
}

uint64_t fnv1a(const void* data, size_t bytes) {
  const unsigned char* p = static_cast<const unsigned char*>(data);
  uint64_t hash = 0xcbf29ce484222325ull;
  for (size_t i = 0; i < bytes; ++i) hash = (hash ^ p[i]) * 0x100000001b3ull;
  return hash;
}

// Bytes of this process's anonymous memory on transparent huge pages (Linux; 0 elsewhere or
// when unknown). The weights are nearly all of it, so this says whether they got huge pages.
double anon_huge_page_bytes() {
  std::FILE* f = std::fopen("/proc/self/smaps_rollup", "r");
  if (f == nullptr) return 0.0;
  char line[256];
  double kib = 0.0;
  while (std::fgets(line, sizeof line, f) != nullptr) {
    if (std::sscanf(line, "AnonHugePages: %lf kB", &kib) == 1) break;
  }
  std::fclose(f);
  return kib * 1024.0;
}

std::string json_escape(const char* text) {
  std::string out;
  for (const char* p = text; *p; ++p) {
    if (*p == '"' || *p == '\\') out += '\\';
    if (static_cast<unsigned char>(*p) >= 0x20) out += *p;
  }
  return out;
}

}  // namespace

int run_run_command(int argc, char** argv) {
  RunOptions o;
  bool help = false;
  if (const int code = parse_options(argc, argv, &o, &help); code != 0) return code;
  if (help) {
    print_usage(stdout);
    return 0;
  }
  const ModelShape& shape = o.shape;
  std::FILE* out = o.json ? stderr : stdout;  // the human report
  const auto run_start = Clock::now();

  // ---- Model size against the memory this process may use (physical, or its cgroup limit).
  ExpertBytes eb;
  std::string error;
  if (!expert_bytes(shape, &eb, &error)) {
    std::fprintf(stderr, "qmoe run: qmoe_quant_matrix_codes_size failed: %s\n", error.c_str());
    return 1;
  }
  const size_t bytes_per_expert = eb.total();
  const double weight_bytes_total =
      static_cast<double>(bytes_per_expert) * shape.experts * shape.layers;
  const double usable = usable_memory_bytes();  // physical, or the cgroup's limit if lower
  if (usable > 0 && weight_bytes_total > 0.7 * usable) {
    const double per_layer = static_cast<double>(bytes_per_expert) * shape.experts;
    std::fprintf(stderr,
                 "qmoe run: %u layers need %.1f GB of weights, over 70%% of the %.1f GB of "
                 "memory this process may use (physical memory, or its cgroup's limit); at "
                 "most %u layers fit here\n",
                 shape.layers, weight_bytes_total * 1e-9, usable * 1e-9,
                 static_cast<unsigned>(0.7 * usable / per_layer));
    return 2;
  }

  // ---- Host, context, kernels.
  qmoe_host_info host;
  std::memset(&host, 0, sizeof(host));
  host.struct_size = sizeof(host);
  QMOE_CHECK(qmoe_get_host_info(&host));
  qmoe_context_options copts;
  qmoe_context_options_init(&copts);
  copts.max_isa = o.isa;
  copts.num_threads = o.threads;
  qmoe_context* raw_context = nullptr;
  QMOE_CHECK(qmoe_context_create(&copts, &raw_context));
  std::unique_ptr<qmoe_context, ContextDeleter> context(raw_context);
  qmoe_isa tier = QMOE_ISA_SCALAR;
  uint32_t threads = 1;
  QMOE_CHECK(qmoe_context_get_isa(context.get(), &tier));
  QMOE_CHECK(qmoe_context_get_num_threads(context.get(), &threads));
  const qmoe_kernel_slot gemm_slot =
      o.accuracy == QMOE_ACCURACY_FAST ? QMOE_KERNEL_GEMM_INT4_FAST : QMOE_KERNEL_GEMM_INT4_EXACT;
  const char* gemm_kernel = nullptr;
  const char* quant_kernel = nullptr;
  const char* bandwidth_kernel = nullptr;
  QMOE_CHECK(qmoe_context_get_kernel_name(context.get(), gemm_slot, &gemm_kernel));
  QMOE_CHECK(qmoe_context_get_kernel_name(context.get(), QMOE_KERNEL_QUANTIZE_ACTIVATIONS_Q8,
                                          &quant_kernel));
  QMOE_CHECK(
      qmoe_context_get_kernel_name(context.get(), QMOE_KERNEL_READ_BANDWIDTH, &bandwidth_kernel));
  const char* accuracy_name = o.accuracy == QMOE_ACCURACY_FAST ? "fast" : "exact";
  const char* activations_name = o.activations == QMOE_DTYPE_F32   ? "f32"
                                 : o.activations == QMOE_DTYPE_F16 ? "f16"
                                                                   : "bf16";

  std::fprintf(out, "qmoe run: libqmoe %s, synthetic Qwen3-30B-A3B-shaped MoE decode\n",
               qmoe_version_string());
  std::fprintf(out, "  %-24s %s\n", "cpu", host.cpu_brand[0] ? host.cpu_brand : "(unknown)");
  std::fprintf(out, "  %-24s %s (best supported %s)\n", "tier", qmoe_isa_name(tier),
               qmoe_isa_name(host.best_supported_isa));
  std::fprintf(out, "  %-24s %u\n", "threads", threads);
  std::fprintf(out, "  %-24s %s: %s\n", "gemm kernel", accuracy_name, gemm_kernel);
  if (o.accuracy == QMOE_ACCURACY_FAST)
    std::fprintf(out, "  %-24s %s\n", "activation quantizer", quant_kernel);
  std::fprintf(out, "  %-24s %s hidden state in and out of each layer%s\n", "activations",
               activations_name,
               o.activations == QMOE_DTYPE_F32 ? "" : " (qmoe_moe_forward_typed)");
  std::fprintf(out,
               "  %-24s %u layers x %u experts (top-%u), hidden %u, intermediate %u\n"
               "  %-24s INT4 block %u, FP16 scales in the grouped order (K/%u x 8 per row "
               "group), no zero points, swiglu interleaved\n",
               "model", shape.layers, shape.experts, shape.top_k, shape.hidden, shape.intermediate,
               "weights", shape.block_size, shape.block_size);
  std::fprintf(out, "  %-24s %.2f MB (fc1 %zu + %zu, fc2 %zu + %zu bytes of codes + scales)\n",
               "bytes per expert", bytes_per_expert * 1e-6, eb.fc1_codes, eb.fc1_scales,
               eb.fc2_codes, eb.fc2_scales);
  std::fprintf(out, "  %-24s %.2f GB\n", "weights in total", weight_bytes_total * 1e-9);
  std::fprintf(out, "  %-24s %u steps x batch %u, seed %" PRIu64 "\n", "decode", o.tokens, o.batch,
               o.seed);
  std::fflush(out);

  // ---- Read bandwidth (a buffer at least 8x the last-level cache, so it is DRAM's).
  const auto bandwidth_start = Clock::now();
  const size_t llc =
      host.l3_cache_bytes
          ? size_t{host.l3_cache_bytes} * (host.l3_cache_instances ? host.l3_cache_instances : 1)
          : size_t{32} << 20;
  const size_t bandwidth_buffer = std::max<size_t>(8 * llc, size_t{256} << 20);
  double bw_one = 0.0, bw_all = 0.0;
  QMOE_CHECK(qmoe_measure_read_bandwidth(context.get(), bandwidth_buffer, 3, 0, &bw_one));
  QMOE_CHECK(qmoe_measure_read_bandwidth(context.get(), bandwidth_buffer, 3, 1, &bw_all));
  const double bw_reference = threads > 1 ? bw_all : bw_one;
  double bandwidth_s = seconds_since(bandwidth_start);
  std::fprintf(out, "  %-24s 1 thread %.1f GB/s, all threads (%u) %.1f GB/s (%zu MiB buffer, %s)\n",
               "read bandwidth", bw_one * 1e-9, threads, bw_all * 1e-9, bandwidth_buffer >> 20,
               bandwidth_kernel);
  std::fflush(out);

  // ---- Weights: 256 FP16 scales in [0.01, 0.02], then every layer from the seed.
  std::vector<float> scale_values(256);
  for (int i = 0; i < 256; ++i) scale_values[i] = 0.01f + 0.01f * static_cast<float>(i) / 255.0f;
  std::vector<uint16_t> scale_table(256);
  QMOE_CHECK(qmoe_convert_f32_to_f16(context.get(), scale_values.data(), scale_table.data(), 256));

  const auto generate_start = Clock::now();
  const unsigned generate_threads = std::max(1u, std::thread::hardware_concurrency());
  std::vector<std::unique_ptr<SyntheticLayer>> layers;
  size_t workspace_bytes = 0;
  {
    Progress progress("generating weights", uint64_t{shape.layers} * shape.experts, true);
    for (uint32_t l = 0; l < shape.layers; ++l) {
      layers.push_back(std::make_unique<SyntheticLayer>());
      const uint64_t before = uint64_t{l} * shape.experts;
      if (!layers.back()->generate(
              shape, eb, o.seed, l, scale_table.data(), generate_threads,
              [&](uint32_t done) { progress.update(before + done); }, &error)) {
        std::fprintf(stderr, "\nqmoe run: %s\n", error.c_str());
        return 1;
      }
      if (l > 0) continue;
      // The workspace grows with --batch (8.9 GiB at 65536 tokens) and needs a set to be
      // sized: checked against memory as soon as the first layer exists, not after all of
      // them, and before the OOM killer could answer instead.
      QMOE_CHECK(qmoe_moe_workspace_size(context.get(), layers[0]->set(), o.accuracy, o.batch,
                                         shape.top_k, &workspace_bytes));
      if (usable > 0 && weight_bytes_total + static_cast<double>(workspace_bytes) > 0.8 * usable) {
        std::fprintf(stderr,
                     "\nqmoe run: the weights (%.1f GB) and a --batch %u workspace (%.1f GB) are "
                     "over 80%% of the %.1f GB of memory this process may use\n",
                     weight_bytes_total * 1e-9, o.batch,
                     static_cast<double>(workspace_bytes) * 1e-9, usable * 1e-9);
        return 2;
      }
    }
    progress.finish();
  }
  const double generate_s = seconds_since(generate_start);

  // ---- Read bandwidth of the weights' own pages: whole layers from the first (the least
  // recently written) until 8x the last-level cache, each read once per pass, best of two
  // passes. On virtual machines the fresh buffer above and the weights can land in memory of
  // different speed from one process to the next; this is the roof of the pages the decode
  // reads.
  double bw_weights = 0.0;
  size_t bw_weights_bytes = 0;
  uint32_t bw_weights_layers = 0;
  {
    const auto start = Clock::now();
    for (int pass = 0; pass < 2; ++pass) {
      double seconds = 0.0;
      size_t bytes = 0;
      uint32_t l = 0;
      for (; l < shape.layers && bytes < bandwidth_buffer; ++l) {
        double layer_bw = 0.0;
        QMOE_CHECK(qmoe_measure_read_bandwidth_over(context.get(), layers[l]->weight_data(),
                                                    layers[l]->weight_bytes(), 1, threads > 1,
                                                    &layer_bw));
        bytes += layers[l]->weight_bytes();
        seconds += layer_bw > 0 ? static_cast<double>(layers[l]->weight_bytes()) / layer_bw : 0;
      }
      const double pass_bw = seconds > 0 ? static_cast<double>(bytes) / seconds : 0.0;
      if (pass_bw > bw_weights) bw_weights = pass_bw;
      bw_weights_bytes = bytes;
      bw_weights_layers = l;
    }
    bandwidth_s += seconds_since(start);
  }

  // ---- Decode.
  const uint32_t m = o.batch, h = shape.hidden, e_count = shape.experts, k = shape.top_k;
  std::vector<float> x(size_t{m} * h), logits(size_t{m} * e_count), weights(size_t{m} * k);
  std::vector<int32_t> ids(size_t{m} * k);
  std::vector<uint8_t> seen(e_count);
  SplitMix64 rng(o.seed ^ 0xD1B54A32D192ED03ull);
  for (float& v : x) v = rng.normalish();
  rms_normalize(x.data(), m, h);
  // With 16-bit activations the hidden state lives in x16 between layers, as in a runtime that
  // keeps FP16 or BF16 activations: each layer reads and writes it in place, and the tool
  // widens it for its RMS rescale and rounds it back (tool time, not the layer's).
  const bool typed = o.activations != QMOE_DTYPE_F32;
  std::vector<uint16_t> x16(typed ? x.size() : 0);
  const auto round_state = [&]() {
    return o.activations == QMOE_DTYPE_F16
               ? qmoe_convert_f32_to_f16(context.get(), x.data(), x16.data(), x.size())
               : qmoe_convert_f32_to_bf16(context.get(), x.data(), x16.data(), x.size());
  };
  const auto widen_state = [&]() {
    return o.activations == QMOE_DTYPE_F16
               ? qmoe_convert_f16_to_f32(context.get(), x16.data(), x.data(), x.size())
               : qmoe_convert_bf16_to_f32(context.get(), x16.data(), x.data(), x.size());
  };
  if (typed) QMOE_CHECK(round_state());

  std::vector<unsigned char> workspace(std::max<size_t>(workspace_bytes, 1));
  qmoe_moe_options mopts;
  qmoe_moe_options_init(&mopts);
  mopts.accumulate = 1;  // y == x: x += moe(x)
  mopts.workspace = workspace.data();
  mopts.workspace_bytes = workspace.size();

  double route_s = 0.0, moe_s = 0.0, tool_s = 0.0;
  uint64_t experts_computed = 0;
  std::vector<double> step_ms;  // wall time of each timed step
  step_ms.reserve(o.tokens);
  // The best timed step's weight bytes over its time inside moe_forward: `ratio`'s quantity
  // over the step the least host noise hit.
  double best_step_bytes_per_s = 0.0;
  // One untimed warm-up step (thread pool, first touches), then the timed steps.
  const uint32_t steps = o.tokens + 1;
  const auto decode_start = Clock::now();
  Clock::time_point timed_start = decode_start;
  {
    Progress progress("decoding", uint64_t{o.tokens} * shape.layers, true);
    for (uint32_t step = 0; step < steps; ++step) {
      const bool timed = step > 0;
      if (step == 1) timed_start = Clock::now();
      const auto step_start = Clock::now();
      double this_moe_s = 0.0;
      uint64_t this_experts = 0;
      for (uint32_t l = 0; l < shape.layers; ++l) {
        auto t0 = Clock::now();
        for (float& v : logits) v = rng.normalish();
        auto t1 = Clock::now();
        QMOE_CHECK(
            qmoe_moe_route_topk(logits.data(), m, e_count, k, 1, ids.data(), weights.data()));
        auto t2 = Clock::now();
        if (typed) {
          QMOE_CHECK(qmoe_moe_forward_typed(context.get(), layers[l]->set(), o.accuracy, m,
                                            o.activations, x16.data(), h, ids.data(),
                                            weights.data(), k, x16.data(), h, &mopts));
        } else {
          QMOE_CHECK(qmoe_moe_forward(context.get(), layers[l]->set(), o.accuracy, m, x.data(), h,
                                      ids.data(), weights.data(), k, x.data(), h, &mopts));
        }
        auto t3 = Clock::now();
        if (typed) QMOE_CHECK(widen_state());
        rms_normalize(x.data(), m, h);
        if (typed) QMOE_CHECK(round_state());
        std::fill(seen.begin(), seen.end(), 0);
        uint32_t distinct = 0;
        for (size_t s = 0; s < ids.size(); ++s) {
          if (weights[s] != 0.0f && !seen[ids[s]]) {
            seen[ids[s]] = 1;
            ++distinct;
          }
        }
        auto t4 = Clock::now();
        if (timed) {
          route_s += std::chrono::duration<double>(t2 - t1).count();
          moe_s += std::chrono::duration<double>(t3 - t2).count();
          this_moe_s += std::chrono::duration<double>(t3 - t2).count();
          tool_s += std::chrono::duration<double>((t1 - t0) + (t4 - t3)).count();
          experts_computed += distinct;
          this_experts += distinct;
          progress.update(uint64_t{step - 1} * shape.layers + l + 1);
        }
      }
      if (timed) {
        step_ms.push_back(seconds_since(step_start) * 1e3);
        if (this_moe_s > 0) {
          best_step_bytes_per_s =
              std::max(best_step_bytes_per_s,
                       static_cast<double>(this_experts) * bytes_per_expert / this_moe_s);
        }
      }
    }
    progress.finish();
  }
  const double decode_s = seconds_since(timed_start);
  const double total_s = seconds_since(run_start);
  const uint64_t checksum = typed ? fnv1a(x16.data(), x16.size() * sizeof(uint16_t))
                                  : fnv1a(x.data(), x.size() * sizeof(float));
  float x_max = 0.0f;
  bool finite = true;
  for (float v : x) {
    finite = finite && std::isfinite(v);
    x_max = std::max(x_max, std::fabs(v));
  }

  // ---- Report.
  std::sort(step_ms.begin(), step_ms.end());
  const double step_min_ms = step_ms.front();
  const size_t mid = step_ms.size() / 2;  // an even count: the mean of the middle two
  const double step_median_ms =
      step_ms.size() % 2 == 1 ? step_ms[mid] : 0.5 * (step_ms[mid - 1] + step_ms[mid]);
  const double step_max_ms = step_ms.back();
  const double token_count = static_cast<double>(o.tokens) * m;
  const double layer_calls = static_cast<double>(o.tokens) * shape.layers;
  const double bytes_read = static_cast<double>(experts_computed) * bytes_per_expert;
  const double experts_per_step_layer = experts_computed / layer_calls;
  const double experts_per_token = experts_computed / token_count;
  const double bytes_per_token = bytes_read / token_count;
  const double achieved = moe_s > 0 ? bytes_read / moe_s : 0.0;
  const double achieved_end_to_end = decode_s > 0 ? bytes_read / decode_s : 0.0;
  const double ratio = bw_reference > 0 ? achieved / bw_reference : 0.0;
  const double ratio_weights = bw_weights > 0 ? achieved / bw_weights : 0.0;
  const double other_s = std::max(0.0, decode_s - route_s - moe_s - tool_s);
  const double huge_page_bytes = std::min(anon_huge_page_bytes(), weight_bytes_total);
  const double ideal_ms_per_step =
      bw_reference > 0 ? bytes_read / bw_reference / o.tokens * 1e3 : 0;
  // Not the fastest whole step (tool work included) against the mean bytes per step, which
  // once stood here and could fall below `ratio`.
  const double ratio_best_step = bw_reference > 0 ? best_step_bytes_per_s / bw_reference : 0.0;

  std::fprintf(out, "\nResults (%u timed steps after 1 warm-up step)\n", o.tokens);
  std::fprintf(out, "  %-24s %.2f s (%u threads)\n", "weight generation", generate_s,
               generate_threads);
  std::fprintf(out, "  %-24s %.0f of %.0f MiB of weights on huge pages\n", "weight memory",
               huge_page_bytes / (1 << 20), weight_bytes_total / (1 << 20));
  std::fprintf(out, "  %-24s %.2f s\n", "bandwidth measurement", bandwidth_s);
  std::fprintf(out, "  %-24s %.3f s\n", "decode", decode_s);
  std::fprintf(out, "  %-24s %.3f ms per step, %.3f ms per token\n", "latency",
               decode_s * 1e3 / o.tokens, decode_s * 1e3 / token_count);
  std::fprintf(out, "  %-24s %.3f ms per layer (moe_forward only)\n", "layer",
               moe_s * 1e3 / layer_calls);
  std::fprintf(out, "  %-24s min %.3f, median %.3f, max %.3f ms (spread = host noise)\n",
               "step time", step_min_ms, step_median_ms, step_max_ms);
  std::fprintf(out, "  %-24s %.2f per layer-step, %.2f per token (%u layers x top-%u = %u)\n",
               "experts computed", experts_per_step_layer, experts_per_token, shape.layers, k,
               shape.layers * k);
  std::fprintf(out, "  %-24s %.2f MB per token, %.2f MB per step\n", "weights read",
               bytes_per_token * 1e-6, bytes_read / o.tokens * 1e-6);
  std::fprintf(out, "  %-24s %.2f GB/s in moe_forward, %.2f GB/s end to end\n", "achieved",
               achieved * 1e-9, achieved_end_to_end * 1e-9);
  std::fprintf(out, "  %-24s %.2f GB/s (%s)\n", "measured read bandwidth", bw_reference * 1e-9,
               threads > 1 ? "all threads" : "1 thread");
  std::fprintf(out, "  %-24s %.2f of measured bandwidth (bandwidth-bound ideal %.3f ms/step)\n",
               "ratio", ratio, ideal_ms_per_step);
  std::fprintf(out, "  %-24s %.2f (the same over the step the least host noise hit)\n",
               "ratio, best step", ratio_best_step);
  // Experts are re-read a step or a few later (each step draws top-k of E per layer afresh);
  // unless one step's weights are well above the LLC, some of those reads come from the cache
  // and the ratio is flattered (a review's LRU model: about 18% of the reads at 0.3x).
  const double step_bytes = bytes_read / o.tokens;
  const double step_over_llc = llc > 0 ? step_bytes / static_cast<double>(llc) : 0.0;
  if (step_over_llc < 2.0) {
    const double per_layer_step = step_bytes / shape.layers;
    std::fprintf(out,
                 "  %-24s a step reads %.0f MB, %.1fx the %.0f MiB last-level cache: some experts "
                 "are re-read from the cache (about %u layers make it 2x)\n",
                 "note", step_bytes * 1e-6, step_over_llc, static_cast<double>(llc) / (1 << 20),
                 static_cast<unsigned>(std::ceil(2.0 * static_cast<double>(llc) / per_layer_step)));
  }
  std::fprintf(out, "  %-24s %.2f GB/s over the first %u layers' weights (%.0f MiB, %s)\n",
               "weights' read bandwidth", bw_weights * 1e-9, bw_weights_layers,
               static_cast<double>(bw_weights_bytes) / (1 << 20),
               threads > 1 ? "all threads" : "1 thread");
  std::fprintf(out, "  %-24s %.2f of the weights' read bandwidth (the pages the decode reads)\n",
               "ratio, weights' pages", ratio_weights);
  std::fprintf(out, "  Where decode time went\n");
  const double pct = decode_s > 0 ? 100.0 / decode_s : 0.0;
  std::fprintf(out, "    %-22s %9.3f ms %5.1f%%\n", "moe_forward", moe_s * 1e3, moe_s * pct);
  std::fprintf(out, "    %-22s %9.3f ms %5.1f%%\n", "route_topk", route_s * 1e3, route_s * pct);
  std::fprintf(out, "    %-22s %9.3f ms %5.1f%%\n", "tool (logits, rms, acct)", tool_s * 1e3,
               tool_s * pct);
  std::fprintf(out, "    %-22s %9.3f ms %5.1f%%\n", "other (progress, loop)", other_s * 1e3,
               other_s * pct);
  std::fprintf(out, "  %-24s %016" PRIx64 " (max |x| %.3g%s)\n", "hidden-state checksum", checksum,
               x_max, finite ? "" : ", NOT FINITE");
  std::fprintf(out, "  %-24s %.2f s\n", "total", total_s);
  std::fflush(out);

  if (o.json) {
    std::printf(
        "{\"command\": \"run\", \"library_version\": \"%s\",\n"
        " \"cpu\": \"%s\", \"tier\": \"%s\", \"threads\": %u,\n"
        " \"accuracy\": \"%s\", \"activations\": \"%s\", \"gemm_kernel\": \"%s\", "
        "\"quantize_kernel\": \"%s\",\n"
        " \"model\": {\"layers\": %u, \"experts\": %u, \"top_k\": %u, \"hidden\": %u, "
        "\"intermediate\": %u, \"format\": \"int4\", \"block_size\": %u, \"scale_dtype\": "
        "\"f16\", \"bytes_per_expert\": %zu, \"weight_bytes_total\": %.0f, "
        "\"weight_bytes_on_huge_pages\": %.0f},\n"
        " \"decode\": {\"steps\": %u, \"batch\": %u, \"seed\": %" PRIu64
        ", \"warmup_steps\": 1},\n"
        " \"bandwidth\": {\"buffer_bytes\": %zu, \"one_thread_gbps\": %.3f, "
        "\"all_threads_gbps\": %.3f, \"reference_gbps\": %.3f, \"weights_gbps\": %.3f, "
        "\"weights_bytes_measured\": %zu},\n"
        " \"timing\": {\"generate_s\": %.4f, \"bandwidth_s\": %.4f, \"decode_s\": %.6f, "
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
        qmoe_version_string(), json_escape(host.cpu_brand).c_str(), qmoe_isa_name(tier), threads,
        accuracy_name, activations_name, gemm_kernel, quant_kernel, shape.layers, shape.experts, k,
        h, shape.intermediate, shape.block_size, bytes_per_expert, weight_bytes_total,
        huge_page_bytes, o.tokens, m, o.seed, bandwidth_buffer, bw_one * 1e-9, bw_all * 1e-9,
        bw_reference * 1e-9, bw_weights * 1e-9, bw_weights_bytes, generate_s, bandwidth_s, decode_s,
        moe_s, route_s, tool_s, other_s, decode_s * 1e3 / o.tokens, step_min_ms, step_median_ms,
        step_max_ms, decode_s * 1e3 / token_count, moe_s * 1e3 / layer_calls, total_s,
        experts_computed, experts_per_token, experts_per_step_layer, bytes_read, bytes_per_token,
        achieved * 1e-9, achieved_end_to_end * 1e-9, ratio, ratio_weights, ratio_best_step,
        step_over_llc, checksum, x_max, finite ? "true" : "false");
  }
  if (!finite) {
    std::fprintf(stderr, "qmoe run: the hidden state is not finite\n");
    return 1;
  }
  return 0;
}
