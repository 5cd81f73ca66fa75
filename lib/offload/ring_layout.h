// The doorbell ring's memory: where every word of the ring lies and who writes it
// (docs/offload.md has the same table with the orderings that publish each word).
//
// The ring is one block of memory shared by a producer (the GPU in production; a host thread
// running the same kernel code in tests, lib/offload/host_device.h) and one consumer (the CPU
// service thread, lib/offload/service.h). In production it is mapped pinned host memory
// (cudaHostAllocMapped): the GPU reaches it over PCIe, the CPU through its caches. In tests it
// is ordinary memory. Nothing here includes a CUDA header: the .cu files include this header
// and get the same offsets through QMOE_HD functions.
//
//   ring header (one line)      error_mirror   u32   writer: device   (sticky error, a copy)
//   entry[slot], slot < R, each entry_bytes, every piece line-aligned:
//     line 0                    req_seq        u64   writer: device   (the doorbell)
//     line 1                    done_seq       u64   writer: host     (the answer)
//                               status         u32   writer: host
//     device payload            meta           RequestMeta           writer: device
//                               ids, weights   [m_capacity * k_max]   writer: device
//                               cold_ids       [min(E_max, m_capacity * k_max)]  device
//                               x tile         [m_capacity, H] elements of the call's dtype
//     host payload              result         [m_capacity, H] elements        writer: host
//
// Every word has exactly one writer, and no line holds words of two writers: a line one side
// writes is only read by the other, so neither side's writes invalidate a line the other is
// writing (and a device write never merges with a host write in one PCIe transaction).
//
// Sequence numbers start at 1 and never wrap (64 bits). Request s lives in slot (s - 1) % R.
// A slot's words move through: req = done = s - R (free; 0 before its first use) -> req = s
// (published, the payload complete) -> done = s (answered, the result complete) -> free again
// once the device has added the result (it then publishes s + R there).
#ifndef QMOE_LIB_OFFLOAD_RING_LAYOUT_H_
#define QMOE_LIB_OFFLOAD_RING_LAYOUT_H_

#include <cstddef>
#include <cstdint>

#if defined(__CUDACC__)
#define QMOE_HD __host__ __device__ __forceinline__
#else
#define QMOE_HD inline
#endif

namespace qmoe::offload {

/// Line size used to keep the two writers apart: a GPU L2 line (128 B), two x86 lines.
constexpr uint64_t kLineBytes = 128;
/// Largest expert count (classify keeps one bit per expert in shared memory), routing slots
/// per call (m_capacity * k_max, as the resident layer) and ring size.
constexpr uint32_t kMaxExperts = 1024;
constexpr uint32_t kMaxSlotsPerCall = 4096;
constexpr uint32_t kMaxRingSize = 1024;
/// Bytes per tile element the ring is sized for (FP32; a 16-bit call uses half of it).
constexpr uint32_t kMaxElementBytes = 4;
/// done_seq's top bit: the request failed (status says how). The device reads the answer and
/// its outcome in one load; sequences never reach 2^63.
constexpr uint64_t kDoneFailed = uint64_t{1} << 63;

/// The sizes a ring is made for (every call's m, k and E are at most these).
struct RingGeometry {
  uint32_t ring_size;        // R entries
  uint32_t m_capacity;       // tokens per request
  uint32_t k_max;            // routing slots per token
  uint32_t num_experts_max;  // E over the session's layers
  uint32_t hidden;           // H, every layer's
};

/// A request's description, written by the device before the doorbell.
struct RequestMeta {
  uint32_t layer;       // the session's layer index
  uint32_t m;           // tokens (rows of ids, weights, x; 0 is a valid empty request)
  uint32_t k;           // slots per token
  uint32_t num_cold;    // unique cold experts, ascending in cold_ids
  uint32_t selections;  // slots (t < m, j < k) whose expert is cold and weight nonzero
  uint32_t dtype;       // qmoe_dtype of x and the result
  uint32_t accuracy;    // qmoe_accuracy the CPU runs at
  uint32_t reserved;    // 0
};
static_assert(sizeof(RequestMeta) == 32, "RequestMeta is 32 bytes in the ring");

/// Byte offsets of a ring's pieces (all multiples of kLineBytes except inside the payload,
/// where each array is 16-byte aligned).
struct RingLayout {
  RingGeometry geometry;
  uint64_t first_entry;  // offset of entry 0 (after the ring header)
  uint64_t entry_bytes;
  // Within an entry:
  uint64_t req, done, status, meta, ids, weights, cold_ids, x, result;
  uint64_t total_bytes;  // the whole ring
};

QMOE_HD uint64_t align_up(uint64_t v, uint64_t a) {
  return (v + a - 1) / a * a;
}

/// Whether a geometry is in range: R in [1, kMaxRingSize], m_capacity, k_max, H >= 1,
/// m_capacity * k_max <= kMaxSlotsPerCall, E in [1, kMaxExperts], k_max <= E, H <= 2^24.
QMOE_HD bool ring_geometry_ok(const RingGeometry& g) {
  return g.ring_size >= 1 && g.ring_size <= kMaxRingSize && g.m_capacity >= 1 && g.k_max >= 1 &&
         uint64_t{g.m_capacity} * g.k_max <= kMaxSlotsPerCall && g.num_experts_max >= 1 &&
         g.num_experts_max <= kMaxExperts && g.k_max <= g.num_experts_max && g.hidden >= 1 &&
         g.hidden <= (1u << 24);
}

/// The layout of a ring for `g` (which must pass ring_geometry_ok; the sizes then cannot
/// overflow: an entry is at most a few hundred MiB).
QMOE_HD RingLayout make_ring_layout(const RingGeometry& g) {
  RingLayout l{};
  l.geometry = g;
  l.first_entry = kLineBytes;  // the ring header: error_mirror
  const uint64_t slots = uint64_t{g.m_capacity} * g.k_max;
  const uint64_t cold = slots < g.num_experts_max ? slots : g.num_experts_max;
  const uint64_t tile = uint64_t{g.m_capacity} * g.hidden * kMaxElementBytes;
  uint64_t at = 0;
  l.req = at;  // line 0: the device's doorbell alone
  at += kLineBytes;
  l.done = at;  // line 1: the host's answer
  l.status = at + 8;
  at += kLineBytes;
  l.meta = at;  // the device's payload
  at += align_up(sizeof(RequestMeta), 16);
  l.ids = at;
  at += align_up(slots * 4, 16);
  l.weights = at;
  at += align_up(slots * 4, 16);
  l.cold_ids = at;
  at += align_up(cold * 4, 16);
  l.x = align_up(at, kLineBytes);
  at = l.x + align_up(tile, kLineBytes);
  l.result = at;  // the host's payload
  at += align_up(tile, kLineBytes);
  l.entry_bytes = at;
  l.total_bytes = l.first_entry + uint64_t{g.ring_size} * l.entry_bytes;
  return l;
}

/// The slot of request `seq` (seq >= 1).
QMOE_HD uint32_t slot_of(uint64_t seq, uint32_t ring_size) {
  return static_cast<uint32_t>((seq - 1) % ring_size);
}

/// Whether request `seq` may be written into its slot: the slot's previous request, seq - R,
/// has had its result added by the device (`consumed` is the last request it added), so
/// neither side still reads or writes that slot's payload.
QMOE_HD bool slot_reusable(uint64_t seq, uint64_t consumed, uint32_t ring_size) {
  return seq <= ring_size || consumed >= seq - ring_size;
}

QMOE_HD unsigned char* ring_entry(unsigned char* ring, const RingLayout& l, uint32_t slot) {
  return ring + l.first_entry + uint64_t{slot} * l.entry_bytes;
}

/// The ring header's copy of the device's sticky error (writer: device).
QMOE_HD uint32_t* ring_error_mirror(unsigned char* ring) {
  return reinterpret_cast<uint32_t*>(ring);
}

template <typename T>
QMOE_HD T* entry_field(unsigned char* entry, uint64_t offset) {
  return reinterpret_cast<T*>(entry + offset);
}

}  // namespace qmoe::offload

#endif  // QMOE_LIB_OFFLOAD_RING_LAYOUT_H_
