// The avx512vnni extension table (see lib/cpu/kernel_table.h for the invariants): overlaid on the
// avx512 tier only when the probe reports AVX512-VNNI (lib/dispatch.cc).
#include "lib/cpu/avx512/kernels_avx512.h"
#include "lib/cpu/kernel_table.h"

namespace qmoe {

const KernelTable kAvx512VnniKernelTable = {
    /*convert_f16_to_f32=*/{nullptr, nullptr},
    /*convert_f32_to_f16=*/{nullptr, nullptr},
    /*convert_bf16_to_f32=*/{nullptr, nullptr},
    /*convert_f32_to_bf16=*/{nullptr, nullptr},
    /*read_bandwidth=*/{nullptr, nullptr},
    /*quantize_activations_q8=*/{nullptr, nullptr},
    /*gemm_int4_exact=*/{nullptr, nullptr},
    /*gemm_int4_fast=*/{&avx512vnni::gemm_int4_fast, "qmoe_gemm_int4_fast_8x32__avx512vnni"},
};

}  // namespace qmoe
