#include "run_options.h"

#include <cmath>
#include <cstring>
#include <string>

#include "model_presets.h"
#include "option_scanner.h"
#include "option_values.h"
#include "tier_names.h"
#include "weight_formats.h"

namespace {

// The option values below are null when the option is the last argument.

bool parse_accuracy(const char* value, qmoe_accuracy* accuracy) {
  if (value != nullptr && std::strcmp(value, "exact") == 0) {
    *accuracy = QMOE_ACCURACY_EXACT;
    return true;
  }
  if (value != nullptr && std::strcmp(value, "fast") == 0) {
    *accuracy = QMOE_ACCURACY_FAST;
    return true;
  }
  return false;
}

bool parse_activations(const char* value, qmoe_dtype* activations) {
  for (qmoe_dtype type : {QMOE_DTYPE_F32, QMOE_DTYPE_F16, QMOE_DTYPE_BF16}) {
    if (value != nullptr && std::strcmp(value, activations_name(type)) == 0) {
      *activations = type;
      return true;
    }
  }
  return false;
}

// A tier name; false, with the complaint naming the tiers in *complaint, for anything else.
// The tiers and the complaint are together so that both can come from the library.
bool parse_isa(const char* value, qmoe_isa* isa, std::string* complaint) {
  if (parse_tier_name(value, isa)) return true;
  *complaint = "takes " + tier_name_list(", ");
  return false;
}

// A format name of the table in weight_formats.h; false, with the complaint naming them, for
// anything else.
bool parse_format(const char* value, qmoe_weight_format* format, std::string* complaint) {
  if (const RunFormat* row = find_run_format(value)) {
    *format = row->format;
    return true;
  }
  *complaint = "takes " + run_format_names(", ");
  return false;
}

bool parse_routing(const char* value, RoutingKind* kind) {
  for (RoutingKind k : {RoutingKind::kUniform, RoutingKind::kZipf, RoutingKind::kDrift}) {
    if (value != nullptr && std::strcmp(value, routing_name(k)) == 0) {
      *kind = k;
      return true;
    }
  }
  return false;
}

bool parse_cache_policy(const char* value, qmoe_cache_policy* policy) {
  static const struct {
    const char* name;
    qmoe_cache_policy policy;
  } kPolicies[] = {{"lru", QMOE_CACHE_POLICY_LRU},
                   {"lfu", QMOE_CACHE_POLICY_LFU},
                   {"lfru", QMOE_CACHE_POLICY_LFRU}};
  for (const auto& p : kPolicies) {
    if (value != nullptr && std::strcmp(value, p.name) == 0) {
      *policy = p.policy;
      return true;
    }
  }
  return false;
}

}  // namespace

const char* cache_policy_name(qmoe_cache_policy policy) {
  switch (policy) {
    case QMOE_CACHE_POLICY_LRU:
      return "lru";
    case QMOE_CACHE_POLICY_LFU:
      return "lfu";
    case QMOE_CACHE_POLICY_LFRU:
      return "lfru";
    default:
      return "none";
  }
}

void print_run_usage(std::FILE* out) {
  std::string formats;  // one line per format: how the synthetic model stores it
  size_t count = 0;
  const RunFormat* rows = run_formats(&count);
  for (size_t i = 0; i < count; ++i) {
    char line[160];
    std::snprintf(line, sizeof line, "                          %-6s block %u, %s scales%s\n",
                  rows[i].name, rows[i].block_size, rows[i].scale_title,
                  rows[i].global_scale != 0.0f ? " and an FP32 global scale" : "");
    formats += line;
  }
  std::string models;  // per model: its layer shape, depth, default format, SwiGLU
  size_t model_count = 0;
  const ModelPreset* presets = model_presets(&model_count);
  for (size_t i = 0; i < model_count; ++i) {
    const ModelPreset& p = presets[i];
    char line[240];
    std::snprintf(line, sizeof line,
                  "                          %-16s %u of %u experts, hidden %u, intermediate %u,\n"
                  "                          %-16s %u MoE layers, %s\n",
                  p.name, p.top_k, p.experts, p.hidden, p.intermediate, "", p.moe_layers,
                  run_format(p.format).name);
    models += line;
    if (p.swiglu_alpha != 1.0f || p.swiglu_beta != 0.0f || std::isfinite(p.swiglu_limit)) {
      std::snprintf(line, sizeof line,
                    "                          %-16s SwiGLU alpha %g, up + %g, clamp %g\n", "",
                    static_cast<double>(p.swiglu_alpha), static_cast<double>(p.swiglu_beta),
                    static_cast<double>(p.swiglu_limit));
      models += line;
    }
  }
  std::fprintf(
      out,
      "usage: qmoe run [options]\n"
      "\n"
      "Decode with a synthetic MoE model of --model's layer shape (its routed experts;\n"
      "attention, dense layers and shared experts are not modeled), weights in --format\n"
      "generated from --seed, router logits drawn per token. Each of the --tokens steps runs\n"
      "--batch tokens through every layer: x += moe(x), then x is rescaled to unit RMS.\n"
      "\n"
      "options:\n"
      "  --model NAME          the layer shape (default %s):\n"
      "%s"
      "  --layers N            MoE layers (default 4; the depths above are the whole models:\n"
      "                        Qwen3-30B-A3B's 48 are ~16 GB in int4)\n"
      "  --tokens T            decode steps (default 64)\n"
      "  --batch M             tokens per step (default 1)\n"
      "  --format %s  weight format (default: the model's):\n"
      "%s"
      "  --accuracy exact|fast dequant-GEMM level (default fast)\n"
      "  --activations f32|f16|bf16  type of the hidden state each layer reads and writes\n"
      "                        (default f32)\n"
      "  --isa %s  highest tier (default: the process default)\n"
      "  --threads N           threads, at most 1024 (default 0 = one per physical core;\n"
      "                        with --gpu one fewer, the core of the thread that waits on\n"
      "                        the GPU)\n"
      "  --seed S              seed of weights and router logits (default 1)\n"
      "  --routing uniform|zipf|drift  router logits: every expert alike (default), or each\n"
      "                        layer's experts ranked, rank r's logit biased by -ln(1 + r);\n"
      "                        drift (with --gpu): the ranking redrawn every --drift-period\n"
      "                        steps (default 500)\n"
      "  --gpu                 hybrid decode on GPU 0 (a build with CUDA): each layer's resident\n"
      "                        experts on the GPU, the others on the CPU, joined through the\n"
      "                        offload ring, every step one CUDA graph of all layers; f32\n"
      "                        activations\n"
      "  --residency F         with --gpu: the fraction of each layer's experts resident, its\n"
      "                        most popular ones (default 1; 0.25, 0.5, 0.75 are typical)\n"
      "  --cache lru|lfu|lfru  with --gpu: the expert cache moves each layer's residency\n"
      "                        between steps (starting from the most popular), promoted experts\n"
      "                        copied on a copy stream while the CPU computes them\n"
      "  --cache-budget N      with --cache: at most N promotions a layer a step (default 0:\n"
      "                        no limit)\n"
      "  --cache-margin A      with --cache: how much a newcomer's score must exceed a\n"
      "                        resident's to take its slot, in selections (lfu, lfru) or\n"
      "                        steps (lru); default 0\n"
      "  --host-memory pinned|pageable  with --gpu: the host experts page-locked, so copies\n"
      "                        to the GPU run on the copy engine alone (default), or pageable\n"
      "                        (the CUDA runtime stages each copy on the calling thread)\n"
      "  --write-store FILE    write the generated weights to an expert store file first\n"
      "  --store FILE          read the weights from an expert store file (written by\n"
      "                        --write-store or qmoe_expert_store_write) instead of generating\n"
      "                        them: its first --layers layers (default all); --model must\n"
      "                        match its experts and widths, --format its format\n"
      "  --map                 with --store: run on the file mapped read-only (the page cache\n"
      "                        holds the weights, 4 KiB pages) instead of reading it into\n"
      "                        weight memory (huge pages)\n"
      "  --json                JSON summary on stdout, human report on stderr\n"
      "  --help                this text\n",
      presets[0].name, models.c_str(), run_format_names("|").c_str(), formats.c_str(),
      tier_name_list("|").c_str());
}

// --help anywhere wins over the other arguments, whatever their order; an option given twice
// is an error rather than the last one silently winning.
int parse_run_options(int argc, char** argv, RunOptions* o, bool* help) {
  if (asks_for_help(argc, argv)) {
    *help = true;
    return 0;
  }
  OptionScanner s("run", print_run_usage, argc, argv);
  size_t model_count = 0;
  const ModelPreset* model = model_presets(&model_count);  // the default: the first
  int code = 0;
  while (s.next(&code)) {
    if (s.is("--json")) {
      o->json = true;
      s.flag();
      continue;
    }
    if (s.is("--map")) {
      o->map_store = true;
      s.flag();
      continue;
    }
    if (s.is("--gpu")) {
      o->gpu = true;
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
      if (!parse_u32(s.value(), 1, 100000, &o->shape.layers)) return s.bad("takes a count >= 1");
    } else if (s.is("--tokens")) {
      if (!parse_u32(s.value(), 1, 100000000, &o->tokens)) return s.bad("takes a count >= 1");
    } else if (s.is("--batch")) {
      if (!parse_u32(s.value(), 1, 65536, &o->batch)) return s.bad("takes a count in [1, 65536]");
    } else if (s.is("--threads")) {
      static_assert(QMOE_MAX_THREADS == 1024u, "the message below names the limit");
      if (!parse_u32(s.value(), 0, QMOE_MAX_THREADS, &o->threads)) {
        return s.bad("takes a count in [0, 1024] (0 = one per core)");
      }
    } else if (s.is("--seed")) {
      if (!parse_u64(s.value(), &o->seed)) return s.bad("takes an unsigned integer");
    } else if (s.is("--format")) {
      std::string complaint;
      if (!parse_format(s.value(), &o->shape.format, &complaint)) return s.bad(complaint.c_str());
    } else if (s.is("--accuracy")) {
      if (!parse_accuracy(s.value(), &o->accuracy)) return s.bad("takes exact or fast");
    } else if (s.is("--activations")) {
      if (!parse_activations(s.value(), &o->activations)) return s.bad("takes f32, f16 or bf16");
    } else if (s.is("--routing")) {
      if (!parse_routing(s.value(), &o->routing)) return s.bad("takes uniform, zipf or drift");
    } else if (s.is("--drift-period")) {
      if (!parse_u32(s.value(), 1, UINT32_MAX, &o->drift_period))
        return s.bad("takes a count >= 1");
    } else if (s.is("--cache")) {
      if (!parse_cache_policy(s.value(), &o->cache)) return s.bad("takes lru, lfu or lfru");
    } else if (s.is("--cache-budget")) {
      if (!parse_u32(s.value(), 0, UINT32_MAX, &o->cache_budget)) {
        return s.bad("takes a count (0: no limit)");
      }
    } else if (s.is("--cache-margin")) {
      if (!parse_decimal_float(s.value(), &o->cache_margin)) {
        return s.bad("takes a decimal number >= 0");
      }
    } else if (s.is("--store") || s.is("--write-store")) {
      if (s.value() == nullptr || s.value()[0] == '\0') return s.bad("takes a file name");
      (s.is("--store") ? o->store : o->write_store) = s.value();
    } else if (s.is("--host-memory")) {
      if (s.value() != nullptr && std::strcmp(s.value(), "pinned") == 0) {
        o->pin_host_experts = true;
      } else if (s.value() != nullptr && std::strcmp(s.value(), "pageable") == 0) {
        o->pin_host_experts = false;
      } else {
        return s.bad("takes pinned or pageable");
      }
    } else if (s.is("--residency")) {
      if (!parse_fraction(s.value(), &o->residency)) return s.bad("takes a fraction in [0, 1]");
    } else if (s.is("--isa")) {
      std::string complaint;
      if (!parse_isa(s.value(), &o->isa, &complaint)) return s.bad(complaint.c_str());
    } else {
      return s.unknown();
    }
  }
  if (code != 0) return code;
  // The model's shape; its own format unless --format named one.
  apply_model_preset(*model, &o->shape);
  if (!s.given("--format")) o->shape.format = model->format;
  if (s.given("--residency") && !o->gpu) return s.refuse("--residency needs --gpu");
  if (o->routing == RoutingKind::kDrift && !o->gpu) return s.refuse("--routing drift needs --gpu");
  if (s.given("--drift-period") && o->routing != RoutingKind::kDrift) {
    return s.refuse("--drift-period needs --routing drift");
  }
  if (s.given("--cache") && !o->gpu) return s.refuse("--cache needs --gpu");
  if (s.given("--host-memory") && !o->gpu) return s.refuse("--host-memory needs --gpu");
  if (o->store != nullptr && o->write_store != nullptr) {
    return s.refuse("--store and --write-store: the weights are either read or generated");
  }
  if (o->map_store && o->store == nullptr) return s.refuse("--map needs --store");
  if (o->map_store && o->gpu) {
    return s.refuse("--map runs on the CPU: --gpu reads the weights into memory (--store alone)");
  }
  o->layers_given = s.given("--layers");
  o->format_given = s.given("--format");
  if (s.given("--cache-budget") && !s.given("--cache")) {
    return s.refuse("--cache-budget needs --cache");
  }
  if (s.given("--cache-margin") && !s.given("--cache")) {
    return s.refuse("--cache-margin needs --cache");
  }
  if (o->gpu && o->activations != QMOE_DTYPE_F32) {
    return s.refuse("--gpu runs f32 activations (--activations f32)");
  }
  return 0;
}

const char* accuracy_name(qmoe_accuracy accuracy) {
  return accuracy == QMOE_ACCURACY_FAST ? "fast" : "exact";
}

const char* activations_name(qmoe_dtype activations) {
  return activations == QMOE_DTYPE_F32 ? "f32" : activations == QMOE_DTYPE_F16 ? "f16" : "bf16";
}
