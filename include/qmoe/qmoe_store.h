/*
 * libqmoe's expert store: a model's MoE experts in one file, laid out so that an expert moves
 * from the file into memory with one read and runs with no repacking, on the CPU and (copied as
 * it is) on the GPU. Host code only (every build has it). C99-clean.
 *
 * The file (docs/formats.md, "Expert store files", byte-exact) holds L layers of E experts of
 * one shape; each expert is one record of expert_bytes (a multiple of 4096): a 64-byte record
 * header naming its layer and expert, with a CRC-32C of the rest, then its FC1 and FC2 planes in
 * the canonical code layout and the grouped scale order (the order the kernels stream best). A
 * record read into memory is self-describing: qmoe_expert_store_create_set describes records
 * wherever they sit (a layer read whole, or experts in the slots of a runtime's pool) and
 * refuses a record of another layer or expert, so a slot mix-up is an error, not a silent wrong
 * answer.
 *
 * Typical use: a runtime writes the store once from its expert sets (qmoe_expert_store_write,
 * or `qmoe run --write-store`), then at load time opens it and, per layer, reads the experts it
 * keeps in host memory (qmoe_expert_store_read into qmoe_alloc_weight_memory memory; pinned, if
 * a GPU will copy them) and creates the layer's set over them; or, for a model larger than
 * memory, maps the layers (qmoe_expert_store_map_layer) and lets the page cache hold what fits,
 * prefetching the experts it predicts and computing the ready ones first.
 *
 * A store handle is immutable after open: any number of threads may read from it at once.
 */
#ifndef QMOE_QMOE_STORE_H_
#define QMOE_QMOE_STORE_H_

#include <stddef.h>
#include <stdint.h>

#include "qmoe/qmoe.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct qmoe_expert_store qmoe_expert_store;

/** What a store holds (qmoe_expert_store_get_info). */
typedef struct qmoe_expert_store_info {
  size_t struct_size; /**< caller sets sizeof(qmoe_expert_store_info) */
  uint32_t num_layers;
  uint32_t num_experts;  /**< E, per layer */
  uint32_t hidden;       /**< H */
  uint32_t intermediate; /**< I */
  qmoe_weight_format fc1_format;
  qmoe_weight_format fc2_format;
  /** Bytes of one expert's record: what qmoe_expert_store_read writes per expert, and the
   * stride between the experts it reads. A multiple of 4096. */
  size_t expert_bytes;
  uint64_t file_bytes; /**< the whole file */
} qmoe_expert_store_info;

/// Writes the experts of `num_layers` layers (each an expert set of the same E, H, I and
/// SwiGLU constants, every FC1 of one format, block size, scale type, zero-point presence and
/// bias type, and every FC2 likewise) to a store file at `path`. The file appears complete or
/// not at all: the bytes go to "<path>.partial" first, are flushed to the device, and are then
/// renamed over `path`; on failure the partial file is removed and `path` is untouched.
/// INVALID_ARGUMENT for a NULL or empty path, NULL layers or a NULL or destroyed set among them,
/// num_layers of 0, or sets that differ in any of the above (the message names the layer, the
/// expert and the field); IO_ERROR when the file cannot be created, written, flushed or renamed
/// (the message has the OS's reason); OUT_OF_MEMORY when a record's buffer cannot be allocated.
QMOE_API qmoe_status qmoe_expert_store_write(const char* path, const qmoe_expert_set* const* layers,
                                             uint32_t num_layers);

/// Opens a store file and checks its header (magic, version, the header's CRC-32C, the shape
/// against the formats' rules, the record size against the shape, the file's size against the
/// header); the records are checked as they are read. INVALID_ARGUMENT for a NULL path or
/// store; IO_ERROR when the file cannot be opened or read; CORRUPT_DATA when the header fails a
/// check (the message names the field and value); UNSUPPORTED_FORMAT for a version newer than
/// this library reads or a weight format it does not have. On failure *store is NULL.
QMOE_API qmoe_status qmoe_expert_store_open(const char* path, qmoe_expert_store** store);

/// Closes the file. NULL is accepted (OK); a closed handle is rejected (INVALID_ARGUMENT) for at
/// least the next 64 closes. Sets created from the store's records stay valid: they point at the
/// caller's memory, not at the store.
QMOE_API qmoe_status qmoe_expert_store_close(qmoe_expert_store* store);

/// Fills *info (its struct_size set by the caller). INVALID_ARGUMENT for a bad handle, a NULL
/// info or a struct_size no version had.
QMOE_API qmoe_status qmoe_expert_store_get_info(const qmoe_expert_store* store,
                                                qmoe_expert_store_info* info);

/// Reads the records of experts ids[0..num_ids) of `layer`: expert ids[i]'s to memory + i *
/// expert_bytes. `memory` must be 64-byte aligned (the planes inside a record are) and `bytes`
/// at least num_ids * expert_bytes; nothing past that is written. Every record's header is
/// checked against (layer, ids[i]); with verify != 0 so is its CRC-32C (about 1 ms per 10 MB on
/// one core: worth it once after a copy or download, not on every read). Positioned reads:
/// calls may run on any threads at once. INVALID_ARGUMENT for a bad handle, a layer or id out
/// of range, NULL ids or memory with num_ids > 0, misaligned memory, or too few bytes (nothing
/// read); IO_ERROR when the OS fails a read or the file has shrunk; CORRUPT_DATA when a record
/// fails its checks (the message names layer and expert). On failure the bytes of `memory` are
/// unspecified.
QMOE_API qmoe_status qmoe_expert_store_read(const qmoe_expert_store* store, uint32_t layer,
                                            const uint32_t* ids, uint32_t num_ids, int verify,
                                            void* memory, size_t bytes);

/// Creates `layer`'s expert set over records in memory: records[e] is the record of expert e
/// for each e < E (as qmoe_expert_store_read wrote it; records may sit anywhere, 64-byte
/// aligned, and must stay valid and unchanged while the set is used). The records' headers are
/// checked (their planes are not: read with verify for that). INVALID_ARGUMENT for a bad
/// handle, a layer out of range, NULL records or a NULL, misaligned or foreign record (the
/// message names e and what the record holds instead); otherwise as qmoe_expert_set_create.
QMOE_API qmoe_status qmoe_expert_store_create_set(const qmoe_expert_store* store, uint32_t layer,
                                                  const void* const* records,
                                                  qmoe_expert_set** set);

/// Creates `layer`'s expert set over the file itself, mapped read-only (mmap, MAP_SHARED): no
/// copy and no allocation of the weights; each expert's pages come from the OS page cache when
/// a kernel first reads them (a read from the device then, unless prefetched), and the OS may
/// drop them again under memory pressure. The way to run a model larger than memory, or to
/// start decoding before a model is read (llama.cpp's mmap); a runtime with the memory reads
/// layers into weight memory instead (huge pages, which a file mapping does not get: on 4 KiB
/// pages the CPU kernels take more TLB misses; qmoe_alloc_weight_memory). Records are not
/// CRC-checked (read with verify for that); their headers are. The set keeps the mapping: it stays
/// valid after qmoe_expert_store_close, until destroyed. The file must not be truncated while such
/// a set is used (the OS signals a read past a file's end: SIGBUS). INVALID_ARGUMENT for a bad
/// handle, a layer out of range or a NULL set; IO_ERROR when the file could not be mapped at
/// open (the message has the OS's reason); CORRUPT_DATA for a record whose header names
/// another layer or expert; otherwise as qmoe_expert_set_create.
QMOE_API qmoe_status qmoe_expert_store_map_layer(const qmoe_expert_store* store, uint32_t layer,
                                                 qmoe_expert_set** set);

/// Asks the OS to start reading experts ids[0..num_ids) of `layer` into the page cache
/// (madvise MADV_WILLNEED on their records) and returns at once: a runtime prefetches the
/// experts it predicts for a coming layer while computing the current one. Advice only: it may
/// read less, and nothing fails for it. INVALID_ARGUMENT for a bad handle, a layer or id out of
/// range, NULL ids with num_ids > 0; IO_ERROR when the file is not mapped.
QMOE_API qmoe_status qmoe_expert_store_prefetch(const qmoe_expert_store* store, uint32_t layer,
                                                const uint32_t* ids, uint32_t num_ids);

/// ready[i] = 1 when every page of expert ids[i]'s record of `layer` is in the page cache (a
/// mapped set reads it at memory speed), else 0 (mincore): ready experts first, e.g. as the
/// run mask of one qmoe_moe_forward while the others arrive, then the rest with accumulate.
/// A snapshot: pages can come and go right after. Errors as qmoe_expert_store_prefetch, and
/// INVALID_ARGUMENT for a NULL ready with num_ids > 0.
QMOE_API qmoe_status qmoe_expert_store_ready(const qmoe_expert_store* store, uint32_t layer,
                                             const uint32_t* ids, uint32_t num_ids, uint8_t* ready);

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* QMOE_QMOE_STORE_H_ */
