// `qmoe cache`: replays one routing trace through the expert cache policies of
// qmoe/qmoe_cache.h (cache_trace.h) and compares them, so that a runtime engineer can pick a
// policy, a slot count and a copy budget before moving any bytes: hit rates, the copies each
// policy asks for and what they weigh at the model's expert size, the selections left to the
// CPU, and what the policy's own bookkeeping (end_step) costs. No weights and no GPU: the
// cache is host code, and the trace is drawn as `qmoe run` draws its routing, or read from a
// file a runtime recorded (routing_trace_file.h), so that a policy is judged on the routing of
// the model it will serve.
#include <algorithm>
#include <cinttypes>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "cache_trace.h"
#include "commands.h"
#include "memory_limit.h"
#include "model_presets.h"
#include "option_scanner.h"
#include "option_values.h"
#include "qmoe/qmoe.h"
#include "routing_trace_file.h"
#include "run_report.h"
#include "run_routing.h"
#include "synthetic_model.h"
#include "weight_formats.h"

namespace {

// The warm-up is the first tenth of the steps: static-warmup's profile, and the cold start the
// online policies' steady-state hit rate leaves out. Ten steps at least, so both parts have one.
constexpr uint32_t kWarmupDivisor = 10;
constexpr uint32_t kMinSteps = kWarmupDivisor;
constexpr uint32_t kMaxSteps = 100000000;
// A bound on the bytes each expert of each layer costs the replay beside the trace: the
// cache's per-expert scores and flags (lib/cache/layer_cache.h, under 40 bytes) and the tool's
// own account of the residency. A recorded trace's header can claim any expert count.
constexpr double kReplayBytesPerLayerExpert = 64.0;

struct CacheOptions {
  // --model, --layers (default: the model's depth) and --format; with --trace, the layers,
  // experts and top-k are the file's and the model says only what one expert weighs.
  ModelShape shape;
  uint32_t tokens = 1;  // with --trace, the file's (the most a step routes)
  uint32_t steps = 2000;
  bool steps_given = false;
  std::string trace_path;         // --trace: replay this file instead of drawing
  uint64_t trace_file_steps = 0;  // the file's steps (--steps may replay fewer)
  std::string write_trace_path;   // --write-trace: the drawn trace goes there too
  double residency = 0.25;
  RoutingKind routing = RoutingKind::kUniform;
  uint32_t drift_period = 500;
  std::vector<CacheRow> rows;  // --policy, in the report's order
  float half_life = 32.0f;
  uint32_t budget = 0;
  float margin = 0.0f;  // --margin: qmoe_expert_cache_desc's admission_margin
  uint64_t seed = 1;
  bool json = false;
};

// What the options come to.
struct CachePlan {
  uint32_t slots = 1;
  uint32_t warmup_steps = 1;
  size_t expert_bytes = 0;  // FC1 and FC2, codes and scales, in --format
};

void print_cache_usage(std::FILE* out) {
  std::string models;
  size_t count = 0;
  const ModelPreset* presets = model_presets(&count);
  for (size_t i = 0; i < count; ++i) {
    char line[160];
    std::snprintf(line, sizeof line,
                  "                        %-16s %u MoE layers, %u of %u experts, %s\n",
                  presets[i].name, presets[i].moe_layers, presets[i].top_k, presets[i].experts,
                  run_format(presets[i].format).name);
    models += line;
  }
  std::fprintf(
      out,
      "usage: qmoe cache [options]\n"
      "\n"
      "Replay one routing trace through the expert cache policies (qmoe/qmoe_cache.h) and\n"
      "compare them. Each of --steps steps routes --tokens tokens through every layer; per\n"
      "step, each layer's ids are observed, then the cache ends the step (admits and evicts).\n"
      "Every policy sees the same trace. Rows:\n"
      "  static-hindsight  each layer's most selected experts over the whole trace, placed\n"
      "                    before step 0: the best static placement (no runtime has it)\n"
      "  static-warmup     the most selected experts of the first 10%% of the steps, placed\n"
      "                    once after them: profile, then freeze\n"
      "  lru, lfu, lfru    online policies, starting empty\n"
      "Steady state: the steps after the first 10%%.\n"
      "\n"
      "options:\n"
      "  --model NAME          the MoE whose layers, experts and top-k to use\n"
      "                        (default %s):\n"
      "%s"
      "  --layers N            MoE layers (default: the model's)\n"
      "  --format %s  the experts' format, for the bytes a copy moves\n"
      "                        (default: the model's)\n"
      "  --tokens M            tokens per step (default 1)\n"
      "  --steps S             steps, at least %u (default 2000)\n"
      "  --residency F         slots per layer: round(F x experts), at least 1; F in (0, 1]\n"
      "                        (default 0.25)\n"
      "  --routing uniform|zipf|drift  every expert alike (default); each layer's experts\n"
      "                        ranked, rank r's logit biased by -ln(1 + r); or that Zipf with\n"
      "                        the ranking redrawn every --drift-period steps\n"
      "  --drift-period P      with --routing drift: steps per ranking (default 500)\n"
      "  --policy all|static|lru|lfu|lfru  rows to run (default all; static: both static rows)\n"
      "  --half-life H         LFRU: steps after which a selection counts half (default 32)\n"
      "  --budget B            experts an online policy may admit per layer per step\n"
      "                        (default 0 = no limit)\n"
      "  --margin A            how much a newcomer's score must exceed a resident's to take\n"
      "                        its slot: selections (LFU, LFRU), steps (LRU); default 0\n"
      "  --seed S              seed of the routing (default 1)\n"
      "  --trace FILE          replay FILE's recorded routing instead of drawing one\n"
      "                        (docs/formats.md, \"Routing traces\"): its layers, experts,\n"
      "                        top-k and tokens; --model and --format still give one\n"
      "                        expert's bytes; --steps N replays its first N steps\n"
      "                        (default: all). Not with --routing, --drift-period,\n"
      "                        --tokens, --layers or --seed\n"
      "  --write-trace FILE    write the drawn trace to FILE in that format, then run\n"
      "  --json                JSON summary on stdout, the table on stderr\n"
      "  --help                this text\n",
      presets[0].name, models.c_str(), run_format_names("|").c_str(), kMinSteps);
}

bool parse_cache_routing(const char* value, RoutingKind* kind) {
  for (RoutingKind k : {RoutingKind::kUniform, RoutingKind::kZipf, RoutingKind::kDrift}) {
    if (value != nullptr && std::strcmp(value, routing_name(k)) == 0) {
      *kind = k;
      return true;
    }
  }
  return false;
}

bool parse_policy(const char* value, std::vector<CacheRow>* rows) {
  if (value == nullptr) return false;
  if (std::strcmp(value, "all") == 0) {
    *rows = {CacheRow::kStaticHindsight, CacheRow::kStaticWarmup, CacheRow::kLru, CacheRow::kLfu,
             CacheRow::kLfru};
  } else if (std::strcmp(value, "static") == 0) {
    *rows = {CacheRow::kStaticHindsight, CacheRow::kStaticWarmup};
  } else if (std::strcmp(value, "lru") == 0) {
    *rows = {CacheRow::kLru};
  } else if (std::strcmp(value, "lfu") == 0) {
    *rows = {CacheRow::kLfu};
  } else if (std::strcmp(value, "lfru") == 0) {
    *rows = {CacheRow::kLfru};
  } else {
    return false;
  }
  return true;
}

bool has_row(const CacheOptions& o, CacheRow row) {
  for (CacheRow r : o.rows) {
    if (r == row) return true;
  }
  return false;
}

// A half-life of finite, positive float steps.
bool parse_half_life(const char* value, float* half_life) {
  float steps = 0.0f;
  if (!parse_decimal_float(value, &steps) || !(steps > 0.0f)) return false;
  *half_life = steps;
  return true;
}

// The trace is held whole (every policy replays it), beside each layer's cache: why that is too
// much, or "" when it fits in half of the usable memory. `bytes_per_selection`: what the trace
// holds per id; `remedy`: what to ask for instead.
std::string over_memory(const CacheOptions& o, double bytes_per_selection, const char* remedy) {
  const ModelShape& shape = o.shape;
  const double bytes = bytes_per_selection * o.steps * shape.layers * o.tokens * shape.top_k +
                       kReplayBytesPerLayerExpert * shape.layers * shape.experts;
  const double usable = usable_memory_bytes();
  if (usable <= 0.0 || bytes <= usable / 2) return "";
  char why[240];
  std::snprintf(why, sizeof why,
                "the trace and the caches would take %.1f GiB, over half of the %.1f GiB usable; "
                "%s",
                bytes / (1 << 30), usable / (1 << 30), remedy);
  return why;
}

// As `qmoe run`: --help anywhere wins; an option given twice is an error. Returns 0, or 2
// after the complaint and the usage on stderr.
int parse_cache_options(int argc, char** argv, CacheOptions* o, bool* help) {
  if (asks_for_help(argc, argv)) {
    *help = true;
    return 0;
  }
  OptionScanner s("cache", print_cache_usage, argc, argv);
  size_t model_count = 0;
  const ModelPreset* model = model_presets(&model_count);  // the default: the first
  parse_policy("all", &o->rows);
  int code = 0;
  while (s.next(&code)) {
    if (s.is("--json")) {
      o->json = true;
      s.flag();
      continue;
    }
    if (s.is("--model")) {
      model = find_model_preset(s.value());
      if (model == nullptr) {
        const std::string names = "takes one of " + model_preset_names(", ");
        return s.bad(names.c_str());
      }
    } else if (s.is("--layers")) {
      if (!parse_u32(s.value(), 1, 100000, &o->shape.layers))
        return s.bad("takes a count in [1, 100000]");
    } else if (s.is("--format")) {
      const RunFormat* format = find_run_format(s.value());
      if (format == nullptr) {
        const std::string names = "takes " + run_format_names(", ");
        return s.bad(names.c_str());
      }
      o->shape.format = format->format;
    } else if (s.is("--tokens")) {
      if (!parse_u32(s.value(), 1, 65536, &o->tokens)) return s.bad("takes a count in [1, 65536]");
    } else if (s.is("--steps")) {
      if (!parse_u32(s.value(), kMinSteps, kMaxSteps, &o->steps)) {
        return s.bad("takes a count in [10, 100000000] (the first tenth is the warm-up)");
      }
      o->steps_given = true;
    } else if (s.is("--residency")) {
      if (!parse_fraction(s.value(), &o->residency) || o->residency <= 0.0) {
        return s.bad("takes a fraction in (0, 1]");
      }
    } else if (s.is("--routing")) {
      if (!parse_cache_routing(s.value(), &o->routing))
        return s.bad("takes uniform, zipf or drift");
    } else if (s.is("--drift-period")) {
      if (!parse_u32(s.value(), 1, UINT32_MAX, &o->drift_period))
        return s.bad("takes a count >= 1");
    } else if (s.is("--policy")) {
      if (!parse_policy(s.value(), &o->rows)) return s.bad("takes all, static, lru, lfu or lfru");
    } else if (s.is("--half-life")) {
      if (!parse_half_life(s.value(), &o->half_life))
        return s.bad("takes a decimal number of steps > 0");
    } else if (s.is("--budget")) {
      if (!parse_u32(s.value(), 0, UINT32_MAX, &o->budget))
        return s.bad("takes a count (0: no limit)");
    } else if (s.is("--margin")) {
      if (!parse_decimal_float(s.value(), &o->margin)) return s.bad("takes a decimal number >= 0");
    } else if (s.is("--seed")) {
      if (!parse_u64(s.value(), &o->seed)) return s.bad("takes an unsigned integer");
    } else if (s.is("--trace")) {
      if (s.value() == nullptr || *s.value() == '\0') return s.bad("takes a file name");
      o->trace_path = s.value();
    } else if (s.is("--write-trace")) {
      if (s.value() == nullptr || *s.value() == '\0') return s.bad("takes a file name");
      o->write_trace_path = s.value();
    } else {
      return s.unknown();
    }
  }
  if (code != 0) return code;
  // The model's shape and depth; its own format unless --format named one.
  const qmoe_weight_format format = o->shape.format;
  const uint32_t layers = o->shape.layers;
  apply_model_preset(*model, &o->shape);
  o->shape.format = s.given("--format") ? format : model->format;
  o->shape.layers = s.given("--layers") ? layers : model->moe_layers;
  // An option that would change nothing is refused, so that nobody reads a table believing it
  // did.
  if (!o->trace_path.empty()) {
    for (const char* draw_option :
         {"--routing", "--drift-period", "--tokens", "--layers", "--seed", "--write-trace"}) {
      if (s.given(draw_option)) {
        const std::string why = std::string(draw_option) +
                                " describes a synthetic draw; with --trace the file is the routing";
        return s.refuse(why.c_str());
      }
    }
  }
  if (s.given("--drift-period") && o->routing != RoutingKind::kDrift) {
    return s.refuse("--drift-period needs --routing drift");
  }
  if (s.given("--half-life") && !has_row(*o, CacheRow::kLfru)) {
    return s.refuse("--half-life is LFRU's: it needs --policy lfru or all");
  }
  const bool online =
      has_row(*o, CacheRow::kLru) || has_row(*o, CacheRow::kLfu) || has_row(*o, CacheRow::kLfru);
  if (s.given("--budget") && !online) {
    return s.refuse("--budget limits the online policies: it needs --policy lru, lfu, lfru or all");
  }
  if (s.given("--margin") && !online) {
    return s.refuse("--margin is the online policies': it needs --policy lru, lfu, lfru or all");
  }
  // A drawn trace holds ids and weights, 8 bytes a selection; a file's is checked once its
  // header is read.
  if (o->trace_path.empty()) {
    if (const std::string why = over_memory(*o, 8.0, "fewer --steps, --tokens or --layers");
        !why.empty()) {
      return s.refuse(why.c_str());
    }
  }
  return 0;
}

// Opens --trace's file and reads its first --steps steps (all of them by default) into *trace;
// the file's layers, experts, top-k and tokens replace the model's in *o (the model keeps
// giving one expert's bytes). Returns 0, or the exit code after the message on stderr: 2 for a
// --steps beyond the file's, 1 for a file that cannot be read or replayed.
int read_trace_file(CacheOptions* o, RoutingTrace* trace) {
  RoutingTraceReader reader;
  std::string error;
  if (!reader.open(o->trace_path, &error)) {
    std::fprintf(stderr, "qmoe cache: %s\n", error.c_str());
    return 1;
  }
  const RoutingTraceHeader& file = reader.header();
  const char* path = o->trace_path.c_str();
  o->trace_file_steps = file.steps;
  if (o->steps_given && o->steps > file.steps) {
    std::fprintf(stderr, "qmoe cache: --steps %u: %s has only %" PRIu64 " steps\n", o->steps, path,
                 file.steps);
    return 2;
  }
  if (!o->steps_given) {
    if (file.steps < kMinSteps) {
      std::fprintf(stderr,
                   "qmoe cache: %s: steps is %" PRIu64
                   "; a replay needs at least %u (the first tenth is the warm-up)\n",
                   path, file.steps, kMinSteps);
      return 1;
    }
    if (file.steps > kMaxSteps) {
      std::fprintf(stderr,
                   "qmoe cache: %s: steps is %" PRIu64
                   ", more than the %u a replay takes; --steps N replays its first N\n",
                   path, file.steps, kMaxSteps);
      return 1;
    }
    o->steps = static_cast<uint32_t>(file.steps);
  }
  ModelShape& shape = o->shape;
  if (file.experts != shape.experts) {
    std::fprintf(stderr,
                 "qmoe cache: %s's layers have %u experts, --model %s's %u: the cache takes the "
                 "file's, the MB columns one %s expert's bytes\n",
                 path, file.experts, shape.model, shape.experts, shape.model);
  }
  shape.layers = file.layers;
  shape.experts = file.experts;
  shape.top_k = file.top_k;
  o->tokens = file.tokens;
  if (const std::string why = over_memory(*o, 4.0, "fewer --steps"); !why.empty()) {
    std::fprintf(stderr, "qmoe cache: %s: %s\n", path, why.c_str());
    return 1;
  }
  if (!reader.read_steps(o->steps, trace, &error)) {
    std::fprintf(stderr, "qmoe cache: %s\n", error.c_str());
    return 1;
  }
  return 0;
}

// Draws the synthetic trace of the options into *trace and, with --write-trace, writes it.
// Returns 0, or the exit code, 1, after the message on stderr.
int draw_trace(const CacheOptions& o, RoutingTrace* trace) {
  const ModelShape& shape = o.shape;
  RoutingDraw draw;
  draw.kind = o.routing;
  draw.layers = shape.layers;
  draw.experts = shape.experts;
  draw.top_k = shape.top_k;
  draw.tokens = o.tokens;
  draw.seed = o.seed;
  draw.drift_period = o.drift_period;
  if (const qmoe_status status = draw_routing(draw, o.steps, trace); status != QMOE_STATUS_OK) {
    std::fprintf(stderr, "qmoe cache: %s (%s)\n", qmoe_last_error_message(),
                 qmoe_status_string(status));
    return 1;
  }
  if (o.write_trace_path.empty()) return 0;
  RoutingTraceHeader header;
  header.layers = shape.layers;
  header.experts = shape.experts;
  header.top_k = shape.top_k;
  header.tokens = o.tokens;
  header.steps = o.steps;
  std::string error;
  if (!write_routing_trace(o.write_trace_path, header, *trace, &error)) {
    std::fprintf(stderr, "qmoe cache: %s\n", error.c_str());
    return 1;
  }
  return 0;
}

// Per step of a span of `steps` steps, summed over the layers.
struct SpanRates {
  double hit_rate = 0.0, promotions = 0.0, megabytes = 0.0, cold_selections = 0.0;
};

SpanRates rates_of(const CacheCounts& counts, uint32_t steps, size_t expert_bytes) {
  SpanRates r;
  r.hit_rate = counts.selections == 0 ? 0.0 : double(counts.hits) / double(counts.selections);
  r.promotions = double(counts.promotions) / steps;
  r.megabytes = r.promotions * double(expert_bytes) * 1e-6;
  r.cold_selections = double(counts.selections - counts.hits) / steps;
  return r;
}

void print_table(std::FILE* out, const CacheOptions& o, const CachePlan& plan,
                 const std::vector<CacheReplayResult>& results) {
  const ModelShape& shape = o.shape;
  const RunFormat& format = run_format(shape.format);
  const uint32_t steady_steps = o.steps - plan.warmup_steps;
  const bool recorded = !o.trace_path.empty();
  const char* tokens_plural = o.tokens == 1 ? "" : "s";
  if (recorded) {
    std::fprintf(out, "qmoe cache: libqmoe %s, expert cache policies on a recorded routing trace\n",
                 qmoe_version_string());
    std::fprintf(out, "  %-13s the file's: %u MoE layers, %u of %u experts a token\n", "model",
                 shape.layers, shape.top_k, shape.experts);
  } else {
    std::fprintf(out, "qmoe cache: libqmoe %s, expert cache policies on a %s routing trace\n",
                 qmoe_version_string(), shape.title);
    std::fprintf(out, "  %-13s %s: %u MoE layers, %u of %u experts a token\n", "model", shape.model,
                 shape.layers, shape.top_k, shape.experts);
  }
  // A recorded trace's experts weigh what --model's do: the table says whose.
  const std::string whose = recorded ? std::string(shape.title) + "'s: " : "";
  std::fprintf(out, "  %-13s %s%zu bytes in %s (FC1 and FC2 codes, %s scales per %u)\n",
               "one expert", whose.c_str(), plan.expert_bytes, format.title, format.scale_title,
               format.block_size);
  if (recorded) {
    std::fprintf(out, "  %-13s %u of the file's %" PRIu64 " steps, up to %u token%s each\n",
                 "trace", o.steps, o.trace_file_steps, o.tokens, tokens_plural);
    std::fprintf(out, "  %-13s recorded, read from %s\n", "routing", o.trace_path.c_str());
  } else {
    std::fprintf(out, "  %-13s %u steps of %u token%s, seed %" PRIu64 "\n", "trace", o.steps,
                 o.tokens, tokens_plural, o.seed);
    if (o.routing == RoutingKind::kDrift) {
      std::fprintf(out, "  %-13s drift: Zipf, each layer's ranking redrawn every %u steps\n",
                   "routing", o.drift_period);
    } else {
      std::fprintf(out, "  %-13s %s\n", "routing",
                   o.routing == RoutingKind::kZipf ? "zipf: rank r's logit biased by -ln(1 + r)"
                                                   : "uniform: every expert alike");
    }
  }
  if (!o.write_trace_path.empty()) {
    std::fprintf(out, "  %-13s %s\n", "written to", o.write_trace_path.c_str());
  }
  const std::string budget = o.budget == 0 ? "no limit" : std::to_string(o.budget);
  std::fprintf(out, "  %-13s %u of %u experts a layer (residency %g)\n", "slots", plan.slots,
               shape.experts, o.residency);
  std::fprintf(out,
               "  %-13s LFRU half-life %g steps; promotions a layer a step: %s; admission "
               "margin %g\n",
               "policies", double(o.half_life), budget.c_str(), double(o.margin));
  std::fprintf(out, "  %-13s the last %u steps (the first %u are the warm-up)\n", "steady state",
               steady_steps, plan.warmup_steps);
  std::fprintf(out,
               "\n%-17s %-15s %-15s %-17s %-15s %s\n"
               "%-17s %-7s %-7s %-7s %-7s %-8s %-8s %-7s %-7s %s\n",
               "", "hit rate", "copies/step", "MB copied/step", "cold sel/step", "end_step",
               "policy", "whole", "steady", "whole", "steady", "whole", "steady", "whole", "steady",
               "median us");
  for (size_t i = 0; i < results.size(); ++i) {
    const SpanRates whole = rates_of(results[i].whole, o.steps, plan.expert_bytes);
    const SpanRates steady = rates_of(results[i].steady, steady_steps, plan.expert_bytes);
    std::fprintf(out, "%-17s %-7.4f %-7.4f %-7.2f %-7.2f %-8.2f %-8.2f %-7.1f %-7.1f %.2f\n",
                 cache_row_name(o.rows[i]), whole.hit_rate, steady.hit_rate, whole.promotions,
                 steady.promotions, whole.megabytes, steady.megabytes, whole.cold_selections,
                 steady.cold_selections, results[i].end_step_median_us);
  }
  std::fprintf(out,
               "  per step: summed over the %u layers; copies: experts made resident (MB = 1e6 "
               "bytes);\n"
               "  cold selections: the ones the CPU computes; end_step: the policy's own time\n"
               "  conservation held: hits <= selections, layer stats sum to the total, each\n"
               "  layer's stats match the replay's, residency within the slots%s\n",
               shape.layers, o.budget != 0 ? ",\n  admissions within the budget" : "");
}

void print_json(const CacheOptions& o, const CachePlan& plan,
                const std::vector<CacheReplayResult>& results) {
  const ModelShape& shape = o.shape;
  const uint32_t steady_steps = o.steps - plan.warmup_steps;
  // Every key in both cases, null where it does not apply: a recorded trace has no draw, a
  // drawn one no file.
  const bool recorded = !o.trace_path.empty();
  auto quoted_or_null = [](const std::string& text) {
    return text.empty() ? std::string("null") : "\"" + json_escape(text.c_str()) + "\"";
  };
  const std::string file = quoted_or_null(o.trace_path);
  const std::string file_steps = recorded ? std::to_string(o.trace_file_steps) : "null";
  const std::string written_to = quoted_or_null(o.write_trace_path);
  const std::string routing = recorded ? "file" : routing_name(o.routing);
  const std::string drift_period =
      !recorded && o.routing == RoutingKind::kDrift ? std::to_string(o.drift_period) : "null";
  const std::string seed = recorded ? "null" : std::to_string(o.seed);
  std::printf(
      "{\"command\": \"cache\", \"library_version\": \"%s\",\n"
      " \"model\": {\"name\": \"%s\", \"layers\": %u, \"experts\": %u, \"top_k\": %u, "
      "\"format\": \"%s\", \"expert_bytes\": %zu},\n"
      " \"trace\": {\"steps\": %u, \"tokens_per_step\": %u, \"routing\": \"%s\", "
      "\"file\": %s, \"file_steps\": %s, \"written_to\": %s, \"drift_period\": %s, "
      "\"seed\": %s, \"warmup_steps\": %u, \"steady_steps\": %u},\n"
      " \"cache\": {\"residency\": %.6g, \"slots\": %u, \"half_life_steps\": %.9g, "
      "\"budget\": %u, \"admission_margin\": %.9g},\n"
      " \"policies\": [",
      qmoe_version_string(), shape.model, shape.layers, shape.experts, shape.top_k,
      run_format(shape.format).name, plan.expert_bytes, o.steps, o.tokens, routing.c_str(),
      file.c_str(), file_steps.c_str(), written_to.c_str(), drift_period.c_str(), seed.c_str(),
      plan.warmup_steps, steady_steps, o.residency, plan.slots, double(o.half_life), o.budget,
      double(o.margin));
  for (size_t i = 0; i < results.size(); ++i) {
    const CacheReplayResult& r = results[i];
    const SpanRates whole = rates_of(r.whole, o.steps, plan.expert_bytes);
    const SpanRates steady = rates_of(r.steady, steady_steps, plan.expert_bytes);
    std::printf(
        "%s\n  {\"policy\": \"%s\", \"hit_rate\": %.6f, \"steady_hit_rate\": %.6f, "
        "\"promotions_per_step\": %.4f, \"steady_promotions_per_step\": %.4f, "
        "\"mb_copied_per_step\": %.4f, \"steady_mb_copied_per_step\": %.4f, "
        "\"cold_selections_per_step\": %.4f, \"steady_cold_selections_per_step\": %.4f, "
        "\"max_layer_promotions_per_step\": %u, \"end_step_median_us\": %.3f, "
        "\"selections\": %" PRIu64 ", \"hits\": %" PRIu64 ", \"promotions\": %" PRIu64
        ", \"evictions\": %" PRIu64 "}",
        i == 0 ? "" : ",", cache_row_name(o.rows[i]), whole.hit_rate, steady.hit_rate,
        whole.promotions, steady.promotions, whole.megabytes, steady.megabytes,
        whole.cold_selections, steady.cold_selections, r.max_layer_promotions, r.end_step_median_us,
        r.whole.selections, r.whole.hits, r.whole.promotions, r.whole.evictions);
  }
  std::printf("]}\n");
}

}  // namespace

int run_cache_command(int argc, char** argv) {
  CacheOptions options;
  bool help = false;
  if (const int code = parse_cache_options(argc, argv, &options, &help); code != 0) return code;
  if (help) {
    print_cache_usage(stdout);
    return 0;
  }
  // One expert's bytes are the model's whatever the trace: a recorded one changes the layers,
  // experts and top-k, not the experts' hidden and intermediate sizes or format.
  const ModelShape& shape = options.shape;
  CachePlan plan;
  ExpertBytes bytes;
  std::string error;
  if (!expert_bytes(shape, &bytes, &error)) {
    std::fprintf(stderr, "qmoe cache: %s\n", error.c_str());
    return 1;
  }
  plan.expert_bytes = bytes.total();
  // The trace next: a recorded one sets the shape the cache takes, and the steps.
  RoutingTrace trace;
  if (const int code = options.trace_path.empty() ? draw_trace(options, &trace)
                                                  : read_trace_file(&options, &trace);
      code != 0) {
    return code;
  }
  plan.slots =
      std::max<uint32_t>(1u, static_cast<uint32_t>(std::lround(options.residency * shape.experts)));
  plan.warmup_steps = options.steps / kWarmupDivisor;

  CacheReplaySetup setup;
  setup.layers = shape.layers;
  setup.experts = shape.experts;
  setup.slots = plan.slots;
  setup.steps = options.steps;
  setup.warmup_steps = plan.warmup_steps;
  setup.half_life_steps = options.half_life;
  setup.max_promotions_per_step = options.budget;
  setup.admission_margin = options.margin;
  std::vector<CacheReplayResult> results(options.rows.size());
  for (size_t i = 0; i < options.rows.size(); ++i) {
    if (const int code = replay_cache(options.rows[i], setup, trace, &results[i]); code != 0) {
      return code;
    }
  }
  print_table(options.json ? stderr : stdout, options, plan, results);
  if (options.json) print_json(options, plan, results);
  return 0;
}
