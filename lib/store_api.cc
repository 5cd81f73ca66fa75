// The expert store ABI (include/qmoe/qmoe_store.h): qmoe_expert_store_* and the handle shells
// behind them. The file's layout is lib/store/store_layout; reading and mapping it,
// lib/store/store_file; writing it, lib/store/store_writer. This file checks arguments and
// builds sets over records (make_store_set) from those parts.
//
// Handles: as with expert sets (lib/expert_set_api.cc), the caller holds a shell {magic,
// StoreFile*} that is never freed, so a closed handle is rejected, not a use-after-free.
#include <atomic>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <memory>
#include <new>
#include <utility>
#include <vector>

#include "lib/error.h"
#include "lib/handle_pool.h"
#include "lib/moe/expert_set.h"
#include "lib/store/store_file.h"
#include "lib/store/store_writer.h"
#include "lib/struct_size.h"
#include "qmoe/qmoe_store.h"

struct qmoe_expert_store {
  // kLiveMagic while open, kDeadMagic after close; atomic so that a caller's racy misuse is a
  // rejected handle rather than a data race inside the library.
  std::atomic<uint64_t> magic{0};
  qmoe::StoreFile* file = nullptr;  // written only while the shell is not live
};

namespace qmoe {
namespace {

constexpr uint64_t kLiveMagic = 0x716d6f652d73746full;  // "qmoe-sto"
constexpr uint64_t kDeadMagic = 0x716d6f652d736464ull;  // "qmoe-sdd"

qmoe_status resolve(const qmoe_expert_store* handle, const char* function, const StoreFile** file) {
  if (const qmoe_status s =
          check_handle(handle, &qmoe_expert_store::file, kLiveMagic, kDeadMagic,
                       QMOE_STATUS_INVALID_ARGUMENT, function, "store", "qmoe expert store");
      s != QMOE_STATUS_OK) {
    return s;
  }
  *file = handle->file;
  return QMOE_STATUS_OK;
}

qmoe_status resolve_layer(const qmoe_expert_store* handle, uint32_t layer, const char* function,
                          const StoreFile** file) {
  if (const qmoe_status s = resolve(handle, function, file); s != QMOE_STATUS_OK) return s;
  const uint32_t layers = (*file)->header().shape.layers;
  if (layer >= layers) {
    return fail(QMOE_STATUS_INVALID_ARGUMENT, function, "layer %u is not below the %u layers",
                layer, layers);
  }
  return QMOE_STATUS_OK;
}

// The start of a call that makes a set: the out-pointer non-null and cleared, then the handle
// and the layer.
qmoe_status begin_set_call(const qmoe_expert_store* handle, uint32_t layer, qmoe_expert_set** set,
                           const char* function, const StoreFile** file) {
  if (set == nullptr)
    return fail(QMOE_STATUS_INVALID_ARGUMENT, function, "set out-pointer is NULL");
  *set = nullptr;
  return resolve_layer(handle, layer, function, file);
}

// The set of `layer` over records record_at(e) for each expert: each record's header checked,
// the projections described in place, `owner` (the mapping, or null) held by the set.
template <typename RecordAt>
qmoe_status make_store_set(const StoreFile& file, uint32_t layer, RecordAt record_at,
                           std::shared_ptr<const unsigned char> owner, const char* function,
                           qmoe_expert_set** set) {
  const StoreShape& shape = file.header().shape;
  const RecordLayout& layout = file.layout();
  std::vector<qmoe_quant_matrix> fc1, fc2;
  std::vector<const qmoe_quant_matrix*> fc1_ptrs, fc2_ptrs;
  try {
    fc1.resize(shape.experts);
    fc2.resize(shape.experts);
    fc1_ptrs.resize(shape.experts);
    fc2_ptrs.resize(shape.experts);
  } catch (const std::bad_alloc&) {
    return fail(QMOE_STATUS_OUT_OF_MEMORY, function, "cannot allocate %u expert descriptions",
                shape.experts);
  }
  for (uint32_t e = 0; e < shape.experts; ++e) {
    const unsigned char* r = record_at(e);
    if (r == nullptr || reinterpret_cast<uintptr_t>(r) % kPlaneAlign != 0) {
      return fail(QMOE_STATUS_INVALID_ARGUMENT, function,
                  "records[%u] = %p is NULL or not 64-byte aligned", e,
                  static_cast<const void*>(r));
    }
    RecordHeader h;
    RecordMismatch why;
    if (!file.record_matches(r, layer, e, &h, &why)) {
      return fail(owner != nullptr ? QMOE_STATUS_CORRUPT_DATA : QMOE_STATUS_INVALID_ARGUMENT,
                  function, "records[%u] holds %s, not expert %u of layer %u", e, why.text, e,
                  layer);
    }
    fc1[e] = describe_record_projection(r, shape.fc1, layout.fc1, h.fc1_global_scale);
    fc2[e] = describe_record_projection(r, shape.fc2, layout.fc2, h.fc2_global_scale);
    fc1_ptrs[e] = &fc1[e];
    fc2_ptrs[e] = &fc2[e];
  }
  qmoe_expert_set_desc d;
  qmoe_expert_set_desc_init(&d);
  d.num_experts = shape.experts;
  d.hidden = shape.hidden;
  d.intermediate = shape.intermediate;
  d.swiglu_fusion = static_cast<qmoe_swiglu_fusion>(shape.fusion);
  d.fc1 = fc1_ptrs.data();
  d.fc2 = fc2_ptrs.data();
  d.swiglu_alpha = shape.alpha;
  d.swiglu_beta = shape.beta;
  d.swiglu_limit = shape.limit;
  ExpertSet* impl = nullptr;
  if (const qmoe_status s = make_expert_set(d, function, &impl); s != QMOE_STATUS_OK) return s;
  impl->owner = std::move(owner);
  return publish_expert_set(impl, function, set);
}

// resolve_layer, the mapping present, ids non-null (with num_ids > 0) and below E.
qmoe_status check_mapped_ids(const qmoe_expert_store* handle, uint32_t layer, const uint32_t* ids,
                             uint32_t num_ids, const char* function, const StoreFile** file) {
  if (const qmoe_status s = resolve_layer(handle, layer, function, file); s != QMOE_STATUS_OK) {
    return s;
  }
  if ((*file)->mapping() == nullptr) {
    return fail(QMOE_STATUS_IO_ERROR, function, "'%s' could not be mapped at open: %s",
                (*file)->path().c_str(), (*file)->map_error());
  }
  if (ids == nullptr && num_ids > 0) {
    return fail(QMOE_STATUS_INVALID_ARGUMENT, function, "ids is NULL with num_ids = %u", num_ids);
  }
  const uint32_t experts = (*file)->header().shape.experts;
  for (uint32_t i = 0; i < num_ids; ++i) {
    if (ids[i] >= experts) {
      return fail(QMOE_STATUS_INVALID_ARGUMENT, function,
                  "ids[%u] = %u is not below the %u experts", i, ids[i], experts);
    }
  }
  return QMOE_STATUS_OK;
}

}  // namespace
}  // namespace qmoe

extern "C" {

QMOE_API qmoe_status qmoe_expert_store_write(const char* path, const qmoe_expert_set* const* layers,
                                             uint32_t num_layers) {
  using namespace qmoe;
  if (path == nullptr || path[0] == '\0') {
    QMOE_FAIL(QMOE_STATUS_INVALID_ARGUMENT, "path is NULL or empty");
  }
  if (layers == nullptr) QMOE_FAIL(QMOE_STATUS_INVALID_ARGUMENT, "layers is NULL");
  if (num_layers == 0) QMOE_FAIL(QMOE_STATUS_INVALID_ARGUMENT, "num_layers is 0");
  std::vector<const ExpertSet*> sets;
  try {
    sets.resize(num_layers);
  } catch (const std::bad_alloc&) {
    QMOE_FAIL(QMOE_STATUS_OUT_OF_MEMORY, "cannot allocate %u layer pointers", num_layers);
  }
  for (uint32_t l = 0; l < num_layers; ++l) {
    if (const qmoe_status s = resolve_expert_set(layers[l], __func__, &sets[l]);
        s != QMOE_STATUS_OK) {
      // The message is rewritten with the index; copied first, as fail() writes the same buffer.
      char why[256];
      std::snprintf(why, sizeof why, "%s", qmoe_last_error_message());
      QMOE_FAIL(s, "layers[%u]: %s", l, why);
    }
  }
  try {
    return write_expert_store(path, sets.data(), num_layers, __func__);
  } catch (const std::bad_alloc&) {
    QMOE_FAIL(QMOE_STATUS_OUT_OF_MEMORY, "out of memory naming the partial file");
  }
}

QMOE_API qmoe_status qmoe_expert_store_open(const char* path, qmoe_expert_store** store) {
  using namespace qmoe;
  if (store == nullptr) QMOE_FAIL(QMOE_STATUS_INVALID_ARGUMENT, "store out-pointer is NULL");
  *store = nullptr;
  if (path == nullptr) QMOE_FAIL(QMOE_STATUS_INVALID_ARGUMENT, "path is NULL");
  StoreFile* file = new (std::nothrow) StoreFile;
  if (file == nullptr) QMOE_FAIL(QMOE_STATUS_OUT_OF_MEMORY, "cannot allocate the store");
  qmoe_status opened = QMOE_STATUS_OK;
  try {
    opened = file->open(path, __func__);
  } catch (const std::bad_alloc&) {
    opened = fail(QMOE_STATUS_OUT_OF_MEMORY, __func__, "out of memory copying the path");
  }
  if (opened != QMOE_STATUS_OK) {
    delete file;
    return opened;
  }
  qmoe_expert_store* shell =
      HandlePool<qmoe_expert_store>::publish(&qmoe_expert_store::file, file, kLiveMagic);
  if (shell == nullptr) {
    delete file;
    QMOE_FAIL(QMOE_STATUS_OUT_OF_MEMORY, "cannot allocate the store handle");
  }
  *store = shell;
  return QMOE_STATUS_OK;
}

QMOE_API qmoe_status qmoe_expert_store_close(qmoe_expert_store* store) {
  using namespace qmoe;
  if (store == nullptr) return QMOE_STATUS_OK;
  const StoreFile* file = nullptr;
  if (const qmoe_status s = resolve(store, __func__, &file); s != QMOE_STATUS_OK) return s;
  if (!HandlePool<qmoe_expert_store>::claim_for_destroy(store, kLiveMagic, kDeadMagic)) {
    QMOE_FAIL(QMOE_STATUS_INVALID_ARGUMENT, "store was closed");
  }
  delete file;
  HandlePool<qmoe_expert_store>::release(store);
  return QMOE_STATUS_OK;
}

QMOE_API qmoe_status qmoe_expert_store_get_info(const qmoe_expert_store* store,
                                                qmoe_expert_store_info* info) {
  using namespace qmoe;
  const StoreFile* file = nullptr;
  if (const qmoe_status s = resolve(store, __func__, &file); s != QMOE_STATUS_OK) return s;
  if (info == nullptr) QMOE_FAIL(QMOE_STATUS_INVALID_ARGUMENT, "info is NULL");
  if (!struct_size_ok(info->struct_size, sizeof(qmoe_expert_store_info))) {
    QMOE_FAIL(QMOE_STATUS_INVALID_ARGUMENT,
              "info->struct_size is %zu, not the size of any version of the struct; set it to "
              "sizeof(qmoe_expert_store_info) (%zu)",
              info->struct_size, sizeof(qmoe_expert_store_info));
  }
  const StoreHeader& h = file->header();
  qmoe_expert_store_info out{};
  out.struct_size = info->struct_size;
  out.num_layers = h.shape.layers;
  out.num_experts = h.shape.experts;
  out.hidden = h.shape.hidden;
  out.intermediate = h.shape.intermediate;
  out.fc1_format = static_cast<qmoe_weight_format>(h.shape.fc1.format);
  out.fc2_format = static_cast<qmoe_weight_format>(h.shape.fc2.format);
  out.expert_bytes = static_cast<size_t>(h.expert_bytes);
  out.file_bytes = h.file_bytes;
  std::memcpy(info, &out, sizeof out);
  return QMOE_STATUS_OK;
}

QMOE_API qmoe_status qmoe_expert_store_read(const qmoe_expert_store* store, uint32_t layer,
                                            const uint32_t* ids, uint32_t num_ids, int verify,
                                            void* memory, size_t bytes) {
  using namespace qmoe;
  const StoreFile* file = nullptr;
  if (const qmoe_status s = resolve_layer(store, layer, __func__, &file); s != QMOE_STATUS_OK) {
    return s;
  }
  if (num_ids == 0) return QMOE_STATUS_OK;
  if (ids == nullptr || memory == nullptr) {
    QMOE_FAIL(QMOE_STATUS_INVALID_ARGUMENT, "ids or memory is NULL with num_ids = %u", num_ids);
  }
  if (reinterpret_cast<uintptr_t>(memory) % kPlaneAlign != 0) {
    QMOE_FAIL(QMOE_STATUS_INVALID_ARGUMENT, "memory %p is not 64-byte aligned", memory);
  }
  const size_t record = static_cast<size_t>(file->header().expert_bytes);
  size_t needed = 0;
  if (__builtin_mul_overflow(size_t{num_ids}, record, &needed) || bytes < needed) {
    QMOE_FAIL(QMOE_STATUS_INVALID_ARGUMENT,
              "bytes = %zu is below num_ids = %u times expert_bytes = %zu", bytes, num_ids, record);
  }
  const uint32_t experts = file->header().shape.experts;
  for (uint32_t i = 0; i < num_ids; ++i) {
    if (ids[i] >= experts) {
      QMOE_FAIL(QMOE_STATUS_INVALID_ARGUMENT, "ids[%u] = %u is not below the %u experts", i, ids[i],
                experts);
    }
  }
  unsigned char* dst = static_cast<unsigned char*>(memory);
  for (uint32_t i = 0; i < num_ids; ++i) {
    if (const qmoe_status s =
            file->read_record(layer, ids[i], verify != 0, dst + size_t{i} * record, __func__);
        s != QMOE_STATUS_OK) {
      return s;
    }
  }
  return QMOE_STATUS_OK;
}

QMOE_API qmoe_status qmoe_expert_store_create_set(const qmoe_expert_store* store, uint32_t layer,
                                                  const void* const* records,
                                                  qmoe_expert_set** set) {
  using namespace qmoe;
  const StoreFile* file = nullptr;
  if (const qmoe_status s = begin_set_call(store, layer, set, __func__, &file);
      s != QMOE_STATUS_OK) {
    return s;
  }
  if (records == nullptr) QMOE_FAIL(QMOE_STATUS_INVALID_ARGUMENT, "records is NULL");
  return make_store_set(
      *file, layer, [records](uint32_t e) { return static_cast<const unsigned char*>(records[e]); },
      nullptr, __func__, set);
}

QMOE_API qmoe_status qmoe_expert_store_map_layer(const qmoe_expert_store* store, uint32_t layer,
                                                 qmoe_expert_set** set) {
  using namespace qmoe;
  const StoreFile* file = nullptr;
  if (const qmoe_status s = begin_set_call(store, layer, set, __func__, &file);
      s != QMOE_STATUS_OK) {
    return s;
  }
  if (file->mapping() == nullptr) {
    QMOE_FAIL(QMOE_STATUS_IO_ERROR, "'%s' could not be mapped at open: %s", file->path().c_str(),
              file->map_error());
  }
  return make_store_set(
      *file, layer, [file, layer](uint32_t e) { return file->mapped_record(layer, e); },
      file->mapping(), __func__, set);
}

QMOE_API qmoe_status qmoe_expert_store_prefetch(const qmoe_expert_store* store, uint32_t layer,
                                                const uint32_t* ids, uint32_t num_ids) {
  using namespace qmoe;
  const StoreFile* file = nullptr;
  if (const qmoe_status s = check_mapped_ids(store, layer, ids, num_ids, __func__, &file);
      s != QMOE_STATUS_OK) {
    return s;
  }
  for (uint32_t i = 0; i < num_ids; ++i) file->prefetch_record(layer, ids[i]);
  return QMOE_STATUS_OK;
}

QMOE_API qmoe_status qmoe_expert_store_ready(const qmoe_expert_store* store, uint32_t layer,
                                             const uint32_t* ids, uint32_t num_ids,
                                             uint8_t* ready) {
  using namespace qmoe;
  const StoreFile* file = nullptr;
  if (const qmoe_status s = check_mapped_ids(store, layer, ids, num_ids, __func__, &file);
      s != QMOE_STATUS_OK) {
    return s;
  }
  if (ready == nullptr && num_ids > 0) QMOE_FAIL(QMOE_STATUS_INVALID_ARGUMENT, "ready is NULL");
  for (uint32_t i = 0; i < num_ids; ++i) {
    bool in_memory = false;
    if (const qmoe_status st = file->record_in_memory(layer, ids[i], &in_memory, __func__);
        st != QMOE_STATUS_OK) {
      return st;
    }
    ready[i] = in_memory ? 1 : 0;
  }
  return QMOE_STATUS_OK;
}

}  // extern "C"
