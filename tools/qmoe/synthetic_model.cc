#include "synthetic_model.h"

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <thread>

namespace {

constexpr size_t kAlign = 64;

size_t round_up(size_t value, size_t to) {
  return (value + to - 1) / to * to;
}

// Stream seed of (seed, layer, expert): independent streams, so the weights do not depend on
// which thread generates which expert.
uint64_t expert_seed(uint64_t seed, uint32_t layer, uint32_t expert) {
  SplitMix64 mix(seed ^ (uint64_t{layer} << 32) ^ expert);
  mix.next();
  return mix.next() ^ 0x5DEECE66Dull;
}

// Random bytes are valid codes in every format: each 4-bit nibble is an INT4 code or an E2M1
// value (E2M1 has no NaN), and every bit of an INT3 tile belongs to exactly one 3-bit code
// (docs/formats.md). The model's N and K are multiples of 8 and 32, so no byte is padding.
void fill_codes(SplitMix64& rng, unsigned char* dst, size_t bytes) {
  size_t i = 0;
  for (; i + 8 <= bytes; i += 8) {
    const uint64_t word = rng.next();
    std::memcpy(dst + i, &word, 8);
  }
  if (i < bytes) {
    const uint64_t word = rng.next();
    std::memcpy(dst + i, &word, bytes - i);
  }
}

// One table entry per scale, indexed by a byte of a random word (eight scales a word, whatever
// their size, so the INT4 model's weights are those it had before other formats came).
template <typename Scale>
void fill_scales_of(SplitMix64& rng, const unsigned char* table_bytes, unsigned char* dst,
                    size_t bytes) {
  const size_t count = bytes / sizeof(Scale);
  Scale table[256];
  std::memcpy(table, table_bytes, sizeof table);
  Scale* scales = reinterpret_cast<Scale*>(dst);
  for (size_t i = 0; i < count; i += 8) {
    uint64_t word = rng.next();
    for (size_t j = i; j < i + 8 && j < count; ++j, word >>= 8) scales[j] = table[word & 0xFF];
  }
}

void fill_scales(SplitMix64& rng, size_t scale_bytes, const unsigned char* table,
                 unsigned char* dst, size_t bytes) {
  if (scale_bytes == 2) {
    fill_scales_of<uint16_t>(rng, table, dst, bytes);
  } else {
    fill_scales_of<uint8_t>(rng, table, dst, bytes);
  }
}

void describe(qmoe_quant_matrix* m, const RunFormat& format, uint32_t n, uint32_t k,
              const void* codes, const void* scales) {
  const uint32_t block_size = format.block_size;
  std::memset(m, 0, sizeof(*m));
  m->struct_size = sizeof(*m);
  m->format = format.format;
  m->n = n;
  m->k = k;
  m->block_size = block_size;
  m->codes = codes;
  m->scale_dtype = format.scale_dtype;
  m->scales = scales;
  // The grouped order (docs/formats.md): per 8-row group of the codes, its K / block x 8
  // scales in a row, so the scales stream alongside the codes.
  m->scale_row_stride = 1;
  m->scale_block_stride = 8;
  m->scale_group_stride = size_t{8} * (k / block_size);
  m->bias_dtype = QMOE_DTYPE_F32;
  m->global_scale = format.global_scale;
}

}  // namespace

void apply_model_preset(const ModelPreset& preset, ModelShape* shape) {
  shape->model = preset.name;
  shape->title = preset.title;
  shape->experts = preset.experts;
  shape->top_k = preset.top_k;
  shape->hidden = preset.hidden;
  shape->intermediate = preset.intermediate;
  shape->swiglu_alpha = preset.swiglu_alpha;
  shape->swiglu_beta = preset.swiglu_beta;
  shape->swiglu_limit = preset.swiglu_limit;
}

bool expert_bytes(const ModelShape& shape, ExpertBytes* bytes, std::string* error) {
  if (qmoe_quant_matrix_codes_size(shape.format, 2 * shape.intermediate, shape.hidden,
                                   &bytes->fc1_codes) != QMOE_STATUS_OK ||
      qmoe_quant_matrix_codes_size(shape.format, shape.hidden, shape.intermediate,
                                   &bytes->fc2_codes) != QMOE_STATUS_OK) {
    *error = qmoe_last_error_message();
    return false;
  }
  // Grouped planes cover whole 8-row groups.
  const RunFormat& format = run_format(shape.format);
  const auto padded = [](uint32_t n) { return (size_t{n} + 7) / 8 * 8; };
  bytes->fc1_scales =
      padded(2 * shape.intermediate) * (shape.hidden / format.block_size) * format.scale_bytes;
  bytes->fc2_scales =
      padded(shape.hidden) * (shape.intermediate / format.block_size) * format.scale_bytes;
  return true;
}

SyntheticLayer::~SyntheticLayer() {
  qmoe_expert_set_destroy(set_);
  qmoe_free_weight_memory(data_);
}

bool SyntheticLayer::generate(const ModelShape& shape, const ExpertBytes& bytes, uint64_t seed,
                              uint32_t layer, const unsigned char* scale_table, unsigned threads,
                              const std::function<void(uint32_t)>& on_expert_done,
                              std::string* error) {
  const RunFormat& format = run_format(shape.format);
  // Per expert, 64-byte aligned: FC1 codes, FC1 scales, FC2 codes, FC2 scales.
  const size_t off_fc1_scales = round_up(bytes.fc1_codes, kAlign);
  const size_t off_fc2_codes = off_fc1_scales + round_up(bytes.fc1_scales, kAlign);
  const size_t off_fc2_scales = off_fc2_codes + round_up(bytes.fc2_codes, kAlign);
  const size_t stride = off_fc2_scales + round_up(bytes.fc2_scales, kAlign);
  const size_t total = stride * shape.experts;
  // Huge pages where the OS allows: the 48-layer decode read its weights at 0.43 of the
  // measured roof on 4 KiB pages and 0.80 on 2 MiB pages (development host,
  // docs/results/2026-11-30-moe-layer-and-decode.md).
  void* memory = nullptr;
  if (qmoe_alloc_weight_memory(total, &memory) == QMOE_STATUS_OK) {
    data_ = static_cast<unsigned char*>(memory);
    bytes_ = total;
  }
  if (data_ == nullptr) {
    *error = "out of memory allocating " + std::to_string(total >> 20) + " MiB for layer " +
             std::to_string(layer);
    return false;
  }

  std::atomic<uint32_t> next{0}, done{0};
  auto work = [&](bool report) {
    for (;;) {
      const uint32_t e = next.fetch_add(1);
      if (e >= shape.experts) break;
      SplitMix64 rng(expert_seed(seed, layer, e));
      unsigned char* base = data_ + stride * e;
      fill_codes(rng, base, bytes.fc1_codes);
      fill_scales(rng, format.scale_bytes, scale_table, base + off_fc1_scales, bytes.fc1_scales);
      fill_codes(rng, base + off_fc2_codes, bytes.fc2_codes);
      fill_scales(rng, format.scale_bytes, scale_table, base + off_fc2_scales, bytes.fc2_scales);
      const uint32_t finished = done.fetch_add(1) + 1;
      if (report) on_expert_done(finished);
    }
  };
  std::vector<std::thread> helpers;
  for (unsigned t = 1; t < threads; ++t) helpers.emplace_back(work, false);
  work(true);
  for (std::thread& helper : helpers) helper.join();
  on_expert_done(shape.experts);

  fc1_.resize(shape.experts);
  fc2_.resize(shape.experts);
  std::vector<const qmoe_quant_matrix*> fc1_ptrs(shape.experts), fc2_ptrs(shape.experts);
  for (uint32_t e = 0; e < shape.experts; ++e) {
    unsigned char* base = data_ + stride * e;
    describe(&fc1_[e], format, 2 * shape.intermediate, shape.hidden, base, base + off_fc1_scales);
    describe(&fc2_[e], format, shape.hidden, shape.intermediate, base + off_fc2_codes,
             base + off_fc2_scales);
    fc1_ptrs[e] = &fc1_[e];
    fc2_ptrs[e] = &fc2_[e];
  }
  qmoe_expert_set_desc desc;
  qmoe_expert_set_desc_init(&desc);
  desc.num_experts = shape.experts;
  desc.hidden = shape.hidden;
  desc.intermediate = shape.intermediate;
  desc.swiglu_fusion = QMOE_SWIGLU_INTERLEAVED;
  desc.swiglu_alpha = shape.swiglu_alpha;
  desc.swiglu_beta = shape.swiglu_beta;
  desc.swiglu_limit = shape.swiglu_limit;
  desc.fc1 = fc1_ptrs.data();
  desc.fc2 = fc2_ptrs.data();
  if (qmoe_expert_set_create(&desc, &set_) != QMOE_STATUS_OK) {
    *error = std::string("qmoe_expert_set_create: ") + qmoe_last_error_message();
    return false;
  }
  return true;
}

bool SyntheticLayer::load(const qmoe_expert_store* store, uint32_t layer,
                          const qmoe_expert_store_info& info, std::string* error) {
  const size_t total = info.expert_bytes * info.num_experts;
  void* memory = nullptr;
  if (qmoe_alloc_weight_memory(total, &memory) != QMOE_STATUS_OK) {
    *error = "out of memory allocating " + std::to_string(total >> 20) + " MiB for layer " +
             std::to_string(layer);
    return false;
  }
  data_ = static_cast<unsigned char*>(memory);
  bytes_ = total;
  std::vector<uint32_t> ids(info.num_experts);
  std::vector<const void*> records(info.num_experts);
  for (uint32_t e = 0; e < info.num_experts; ++e) {
    ids[e] = e;
    records[e] = data_ + size_t{e} * info.expert_bytes;
  }
  if (qmoe_expert_store_read(store, layer, ids.data(), info.num_experts, 1, data_, total) !=
          QMOE_STATUS_OK ||
      qmoe_expert_store_create_set(store, layer, records.data(), &set_) != QMOE_STATUS_OK) {
    *error = qmoe_last_error_message();
    return false;
  }
  return true;
}

bool SyntheticLayer::map(const qmoe_expert_store* store, uint32_t layer, std::string* error) {
  if (qmoe_expert_store_map_layer(store, layer, &set_) != QMOE_STATUS_OK) {
    *error = qmoe_last_error_message();
    return false;
  }
  return true;
}
