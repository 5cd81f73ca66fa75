// The device side of the doorbell protocol: the bodies of the two offload steps, written once
// over a "CTA" type that supplies the block's threads, barriers, the memory operations with
// their scopes, and a clock. lib/cuda/offload_kernels.cu instantiates them with the GPU's
// (barriers are __syncthreads*, system-scope operations are libcu++ atomic_ref with
// thread_scope_system, the clock is %globaltimer), and so does lib/cuda/moe_layer.cu, whose
// FC1 kernel carries the classify-publish in a hybrid layer; lib/offload/host_device.h with
// host threads (a barrier per block, __atomic builtins), so the tests on machines without a
// GPU run this very code against the CPU service thread, under ThreadSanitizer too.
//
// A Cta provides:
//   thread(), threads(), block(), blocks()
//   sync(); sync_count(int) -> threads with a nonzero predicate; sync_or(int)     (barriers)
//   load_acquire_system(const uint64_t*), store_release_system(uint64_t*, uint64_t),
//   store_relaxed_system(uint32_t*, uint32_t), fence_system()       (mapped host memory)
//   load_relaxed(const uint32_t*), atomic_or(uint32_t*, uint32_t)   (the sticky error word)
//   load_acquire_device(const uint64_t*), store_release_device(uint64_t*, uint64_t)
//                                                  (answered_seq: device memory, GPU scope)
//   shared_or(uint32_t*, uint32_t)                                   (shared memory)
//   load_result(dtype, p, i)                                         (host-written payload)
//   load_element(dtype, p, i), store_element(dtype, p, i, float)     (y in device memory)
//   float_bits(float), now_ns(), relax(spins)
//
// The memory-ordering argument, in the PTX memory model's terms:
//  - Publish (device -> host). Every thread of the one classify-publish block writes its part
//    of the payload with plain stores, then fence_system() (fence.sc.sys, __threadfence_system),
//    then the barrier; thread 0 then stores req_seq with st.release.sys. Each payload store is
//    ordered before its own thread's system fence, the barrier orders those fences before
//    thread 0's release, and the release orders everything before it ahead of the doorbell:
//    a host that reads req_seq == s with an acquire load sees the whole payload. (The fence in
//    every writing thread is stronger than the release alone needs; it does not depend on the
//    barrier being cumulative at system scope. The bug the vLLM offload PR had, the fence after
//    the flag, cannot happen: the flag is the last store and comes after the barrier.)
//  - Answer (host -> device). The service writes the result and status, then stores done_seq
//    (s, with kDoneFailed set when the request failed) with a release (x86: a plain store
//    after the compiler barrier; stores are not reordered with older stores). Thread 0 of wait
//    block 0 loads done_seq with ld.acquire.sys; once it reads s, the barrier passes that to
//    the block's other threads, which read the result. They read it with ld.global.cv
//    (load_result: never from a cached line), so no stale copy of a previous lap's result in
//    L1 or L2 can be returned. Only block 0 polls done_seq over PCIe; once it has acquired s it
//    release-stores s into answered_seq (device memory), and a block that acquires s there reads
//    the result after it: release and acquire chains are transitive (causality order), so the
//    host's writes are visible to it too.
//  - Device-only state (next_seq, consumed_seq, records, telemetry) is written by one thread of
//    one kernel and read by later kernels of the same stream: kernel boundaries order them.
#ifndef QMOE_LIB_OFFLOAD_KERNELS_H_
#define QMOE_LIB_OFFLOAD_KERNELS_H_

#include <cstdint>

#include "lib/offload/device_state.h"
#include "lib/offload/ring_layout.h"
#include "qmoe/qmoe.h"

#if defined(__CUDACC__)
#define QMOE_OFFLOAD_BODY __device__ __forceinline__
#else
#define QMOE_OFFLOAD_BODY inline
#endif

namespace qmoe::offload {

/// The arguments of one classify-publish launch: pointers and sizes only, the same on every
/// replay of a captured graph (the per-call values are read from the memory they point at).
struct ClassifyArgs {
  OffloadDeviceState* state;
  OffloadCallRecord* record;  // this layer's record
  uint8_t* token_cold;        // this layer's per-token flags [geometry.m_capacity]
  unsigned char* ring;        // the ring as the device addresses it
  RingLayout layout;
  const uint32_t* m;         // the call's token count
  const int32_t* ids;        // [m, k] (the MoE layer routing logits: its block's routed tables)
  const float* weights;      // [m, k] (likewise)
  const int32_t* residency;  // [num_experts]: expert -> slot, or -1
  const void* x;             // [m, hidden], row t at x + t * ldx elements
  uint64_t ldx;
  uint32_t layer;
  uint32_t m_capacity;  // the call's, <= geometry.m_capacity
  uint32_t k;           // <= geometry.k_max
  uint32_t num_experts, num_slots;
  uint32_t dtype, accuracy;  // qmoe_dtype, qmoe_accuracy
  uint32_t short_circuit;    // nonzero: a call with no cold selection publishes nothing
  // Nonzero: the caller found the routing invalid (the MoE layer's own checks of the router
  // logits it routed into ids and weights): the call is refused and reads neither.
  uint32_t routing_invalid;
};

struct ClassifyShared {
  uint32_t cold_words[kMaxExperts / 32];  // bit e: expert e has a cold selection
  uint32_t word_start[kMaxExperts / 32];  // cold experts in the words before this one
  uint64_t seq;                           // the request's sequence, 0 when none
  uint32_t m, error, num_cold;
};

struct WaitArgs {
  OffloadDeviceState* state;
  const OffloadCallRecord* record;
  const uint8_t* token_cold;
  unsigned char* ring;
  RingLayout layout;
  void* y;  // [m, hidden], row t at y + t * ldy elements
  uint64_t ldy;
  uint32_t dtype;
  uint64_t timeout_ns;  // how long a block waits for done_seq
};

struct WaitShared {
  uint64_t seq;
  uint32_t m, ok;
};

QMOE_HD uint32_t popcount32(uint32_t v) {
#if defined(__CUDA_ARCH__)
  return static_cast<uint32_t>(__popc(v));
#else
  return static_cast<uint32_t>(__builtin_popcount(v));
#endif
}

QMOE_HD uint32_t lowest_bit(uint32_t v) {  // v != 0
#if defined(__CUDA_ARCH__)
  return static_cast<uint32_t>(__ffs(static_cast<int>(v)) - 1);
#else
  return static_cast<uint32_t>(__builtin_ctz(v));
#endif
}

QMOE_HD uint32_t element_bytes(uint32_t dtype) {
  return dtype == QMOE_DTYPE_F32 ? 4u : 2u;
}

/// 16 bytes, copied as one load and one store where the compiler can (the device: 128-bit).
struct alignas(16) Bytes16 {
  uint32_t word[4];
};

/// The x tile into the ring: m rows of row_bytes, from rows src_stride bytes apart, packed.
/// 16-byte pieces when every row starts 16-byte aligned on both sides (the common case: a
/// quarter of the PCIe writes of 4-byte pieces), else 2-byte ones (any dtype's rows are).
QMOE_OFFLOAD_BODY void copy_tile(uint32_t tid, uint32_t nt, uint32_t m, uint64_t row_bytes,
                                 const unsigned char* src, uint64_t src_stride,
                                 unsigned char* dst) {
  const bool wide = (reinterpret_cast<uintptr_t>(src) | src_stride | row_bytes |
                     reinterpret_cast<uintptr_t>(dst)) %
                        16 ==
                    0;
  for (uint32_t t = 0; t < m; ++t) {
    const unsigned char* from = src + t * src_stride;
    unsigned char* to = dst + t * row_bytes;
    if (wide) {
      const Bytes16* f = reinterpret_cast<const Bytes16*>(from);
      Bytes16* d = reinterpret_cast<Bytes16*>(to);
      for (uint64_t i = tid; i < row_bytes / 16; i += nt) d[i] = f[i];
    } else {
      const uint16_t* f = reinterpret_cast<const uint16_t*>(from);
      uint16_t* d = reinterpret_cast<uint16_t*>(to);
      for (uint64_t i = tid; i < row_bytes / 2; i += nt) d[i] = f[i];
    }
  }
}

/// Classify one layer call's selections against the residency map and, when some are cold (or
/// always, with the short circuit off), publish the request on the ring. One block.
///
/// Outcomes, decided alike by every thread: refused (the sticky error is set, or the routing is
/// invalid: m above the capacity, an id outside [0, E), a non-finite weight, a residency entry
/// outside [-1, slots), or routing_invalid; nothing read past that, nothing published),
/// short-circuited (no cold selection: nothing written to the ring, no slot used, the record says
/// no request), or published. The record's seq tells the wait which.
template <class Cta>
QMOE_OFFLOAD_BODY void classify_publish(Cta& cta, ClassifyShared& sh, const ClassifyArgs& a) {
  const uint32_t tid = cta.thread();
  const uint32_t nt = cta.threads();
  const uint32_t words = (a.num_experts + 31) / 32;
  for (uint32_t w = tid; w < words; w += nt) sh.cold_words[w] = 0;
  if (tid == 0) {
    sh.error = cta.load_relaxed(&a.state->error);
    sh.m = *a.m;
    sh.seq = 0;
  }
  cta.sync();
  const uint32_t m = sh.m;
  const bool routing_ok = m <= a.m_capacity && a.routing_invalid == 0;
  // After an error nothing more is read: later calls fail fast.
  const uint32_t slots = routing_ok && sh.error == 0 ? m * a.k : 0;
  uint32_t selections = 0;
  int invalid = routing_ok ? 0 : 1;
  // Every thread runs the same number of rounds, so each barrier is reached by all of them.
  for (uint32_t base = 0; base < slots; base += nt) {
    const uint32_t i = base + tid;
    int cold = 0;
    if (i < slots) {
      const int32_t e = a.ids[i];
      const Selection s = classify_selection(e, cta.float_bits(a.weights[i]), a.residency,
                                             a.num_experts, a.num_slots);
      if (s == Selection::kInvalid) {
        invalid = 1;
      } else if (s == Selection::kCold) {
        cold = 1;
        cta.shared_or(&sh.cold_words[static_cast<uint32_t>(e) >> 5], 1u << (e & 31));
      }
    }
    selections += static_cast<uint32_t>(cta.sync_count(cold));
  }
  // Also the barrier after the last shared_or.
  invalid = cta.sync_or(invalid);
  const bool publish = sh.error == 0 && invalid == 0 && (selections > 0 || a.short_circuit == 0);

  if (publish) {
    const uint32_t ring_size = a.layout.geometry.ring_size;
    if (tid == 0) {
      uint32_t total = 0;
      for (uint32_t w = 0; w < words; ++w) {
        sh.word_start[w] = total;
        total += popcount32(sh.cold_words[w]);
      }
      sh.num_cold = total;
      const uint64_t seq = a.state->next_seq;
      if (slot_reusable(seq, a.state->consumed_seq, ring_size)) {
        sh.seq = seq;
      } else {
        cta.atomic_or(&a.state->error, kErrorProtocol);
      }
    }
    cta.sync();
    const uint64_t seq = sh.seq;
    if (seq != 0) {
      unsigned char* entry = ring_entry(a.ring, a.layout, slot_of(seq, ring_size));
      const uint32_t count = m * a.k;
      if (tid == 0) {
        RequestMeta meta;
        meta.layer = a.layer;
        meta.m = m;
        meta.k = a.k;
        meta.num_cold = sh.num_cold;
        meta.selections = selections;
        meta.dtype = a.dtype;
        meta.accuracy = a.accuracy;
        meta.reserved = 0;
        *entry_field<RequestMeta>(entry, a.layout.meta) = meta;
      }
      int32_t* ids = entry_field<int32_t>(entry, a.layout.ids);
      float* weights = entry_field<float>(entry, a.layout.weights);
      for (uint32_t i = tid; i < count; i += nt) {
        ids[i] = a.ids[i];
        weights[i] = a.weights[i];
      }
      int32_t* cold = entry_field<int32_t>(entry, a.layout.cold_ids);
      for (uint32_t w = tid; w < words; w += nt) {
        uint32_t bits = sh.cold_words[w];
        uint32_t at = sh.word_start[w];
        while (bits != 0) {
          cold[at++] = static_cast<int32_t>(w * 32 + lowest_bit(bits));
          bits &= bits - 1;
        }
      }
      copy_tile(tid, nt, m, a.layout.geometry.hidden * element_bytes(a.dtype),
                static_cast<const unsigned char*>(a.x), a.ldx * element_bytes(a.dtype),
                entry + a.layout.x);
      // The payload, then the fence, then (after every thread's fence) the doorbell.
      cta.fence_system();
      cta.sync();
      if (tid == 0) cta.store_release_system(entry_field<uint64_t>(entry, a.layout.req), seq);

      // Which tokens have a cold selection: the wait adds the result to those rows only.
      for (uint32_t t = tid; t < m; t += nt) {
        uint8_t has = 0;
        for (uint32_t j = 0; j < a.k; ++j) {
          const uint32_t i = t * a.k + j;
          if (classify_selection(a.ids[i], cta.float_bits(a.weights[i]), a.residency, a.num_experts,
                                 a.num_slots) == Selection::kCold) {
            has = 1;
          }
        }
        a.token_cold[t] = has;
      }
    }
  }

  if (tid == 0) {
    const uint64_t seq = sh.seq;  // 0 unless published
    OffloadCallRecord& r = *a.record;
    r.seq = seq;
    r.m = m;
    r.selections = selections;
    r.num_cold = seq != 0 ? sh.num_cold : 0;
    DeviceTelemetry& t = a.state->telemetry;
    ++t.classify_calls;
    if (seq != 0) {
      a.state->next_seq = seq + 1;
      ++t.published;
      t.cold_selections += selections;
    } else if (sh.error == 0 && invalid == 0 && !publish) {
      ++t.short_circuits;
    } else {
      ++t.refused;
    }
    // Let the host see a sticky error without reading device memory (qmoe_cuda_offload_forward
    // then fails fast before enqueueing anything).
    const uint32_t error = cta.load_relaxed(&a.state->error);
    if (error != 0) cta.store_relaxed_system(ring_error_mirror(a.ring), error);
  }
}

/// How often a wait block other than block 0 looks at the host's done word itself (await_answer).
constexpr uint32_t kHostPollInterval = 32;

/// A wait block's thread 0 waits, by itself and for at most timeout_ns, for the
/// call's request to be answered. On a timeout it sets the sticky error; a failure status from
/// the service sets it too. Block 0 records the answered request as consumed. Returns, in every
/// thread (after a barrier), whether the block has a result to add: false also when the call
/// published no request (short circuit, refused call) or another block already timed out.
template <class Cta>
QMOE_OFFLOAD_BODY bool await_answer(Cta& cta, WaitShared& sh, const WaitArgs& a) {
  if (cta.thread() == 0) {
    const uint64_t seq = a.record->seq;
    sh.seq = seq;
    sh.m = a.record->m;
    uint32_t ok = 0;
    if (seq != 0) {
      unsigned char* entry =
          ring_entry(a.ring, a.layout, slot_of(seq, a.layout.geometry.ring_size));
      const uint64_t* done = entry_field<uint64_t>(entry, a.layout.done);
      const uint64_t start = cta.now_ns();
      // Block 0 polls the host's done word; the other blocks poll block 0's copy of it in
      // device memory (answered_seq, an L2 hit) and the host's word only every
      // kHostPollInterval-th time, so that they do not depend on block 0 running. One poller
      // over PCIe instead of one per block (up to 64).
      const bool poller = cta.block() == 0;
      for (uint32_t spins = 0;; ++spins) {
        const uint64_t answer = poller || spins % kHostPollInterval == kHostPollInterval - 1
                                    ? cta.load_acquire_system(done)
                                    : 0;
        if ((answer & ~kDoneFailed) == seq) {
          // The failure bit rides in the same word: no second PCIe read for the status.
          if ((answer & kDoneFailed) == 0) {
            ok = 1;
          } else {
            cta.atomic_or(&a.state->error, kErrorHost);
          }
          // After the error bit: a block that acquires the copy sees the bit too.
          if (poller) cta.store_release_device(&a.state->answered_seq, seq);
          break;
        }
        if (!poller && cta.load_acquire_device(&a.state->answered_seq) == seq) {
          ok = cta.load_relaxed(&a.state->error) == 0 ? 1 : 0;
          break;
        }
        // Another block timed out, or an earlier failure: stop waiting at once.
        if (cta.load_relaxed(&a.state->error) != 0) break;
        if (cta.now_ns() - start > a.timeout_ns) {
          cta.atomic_or(&a.state->error, kErrorTimeout);
          break;
        }
        cta.relax(spins);
      }
      if (cta.block() == 0) {
        if (ok) a.state->consumed_seq = seq;
        const uint32_t error = cta.load_relaxed(&a.state->error);
        if (error != 0) cta.store_relaxed_system(ring_error_mirror(a.ring), error);
      }
    }
    sh.ok = ok;
  }
  cta.sync();
  return sh.ok != 0;
}

/// Wait for the call's request to be answered and add its result into y. Any number of blocks;
/// block b adds columns [b * chunk, (b + 1) * chunk). After a timeout or a failed request the
/// blocks return without touching y (so y is unspecified then, and the session's error says
/// so). No request (short circuit, refused call): nothing to do.
template <class Cta>
QMOE_OFFLOAD_BODY void wait_accumulate(Cta& cta, WaitShared& sh, const WaitArgs& a) {
  if (!await_answer(cta, sh, a)) return;
  const uint32_t hidden = a.layout.geometry.hidden;
  const uint32_t blocks = cta.blocks();
  const uint32_t chunk = ((hidden + blocks - 1) / blocks + 31) / 32 * 32;
  const uint32_t h0 = cta.block() * chunk;
  const uint32_t h1 = h0 + chunk < hidden ? h0 + chunk : hidden;
  const uint32_t tid = cta.thread();
  const uint32_t nt = cta.threads();
  const unsigned char* result =
      ring_entry(a.ring, a.layout, slot_of(sh.seq, a.layout.geometry.ring_size)) + a.layout.result;
  for (uint32_t t = 0; t < sh.m; ++t) {
    if (a.token_cold[t] == 0) continue;
    for (uint32_t h = h0 + tid; h < h1; h += nt) {
      const float add = cta.load_result(a.dtype, result, uint64_t{t} * hidden + h);
      const uint64_t at = t * a.ldy + h;
      cta.store_element(a.dtype, a.y, at, cta.load_element(a.dtype, a.y, at) + add);
    }
  }
}

}  // namespace qmoe::offload

#endif  // QMOE_LIB_OFFLOAD_KERNELS_H_
