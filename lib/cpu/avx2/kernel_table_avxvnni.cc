// The avxvnni extension table (see lib/cpu/kernel_table.h for the invariants): overlaid on the avx2
// and avx512 tiers only when the probe reports AVX-VNNI (lib/dispatch.cc).
#include "lib/cpu/avx2/kernels_avx2.h"
#include "lib/cpu/kernel_table.h"

namespace qmoe {

const KernelTable kAvxVnniKernelTable = {
    /*convert_f16_to_f32=*/{nullptr, nullptr},
    /*convert_f32_to_f16=*/{nullptr, nullptr},
    /*convert_bf16_to_f32=*/{nullptr, nullptr},
    /*convert_f32_to_bf16=*/{nullptr, nullptr},
    /*read_bandwidth=*/{nullptr, nullptr},
    /*quantize_activations_q8=*/{nullptr, nullptr},
    /*gemm_int4_exact=*/{nullptr, nullptr},
    /*gemm_int4_fast=*/{&avxvnni::gemm_int4_fast, "qmoe_gemm_int4_fast_8x32__avxvnni"},
};

}  // namespace qmoe
