// The avx2 kernel table (see lib/cpu/kernel_table.h for the invariants).
#include "lib/cpu/avx2/kernels_avx2.h"
#include "lib/cpu/kernel_table.h"

namespace qmoe {

const KernelTable kAvx2KernelTable = {
    /*convert_f16_to_f32=*/{&avx2::convert_f16_to_f32, "qmoe_convert_f16_to_f32__avx2"},
    /*convert_f32_to_f16=*/{&avx2::convert_f32_to_f16, "qmoe_convert_f32_to_f16__avx2"},
    /*convert_bf16_to_f32=*/{&avx2::convert_bf16_to_f32, "qmoe_convert_bf16_to_f32__avx2"},
    /*convert_f32_to_bf16=*/{&avx2::convert_f32_to_bf16, "qmoe_convert_f32_to_bf16__avx2"},
    /*read_bandwidth=*/{&avx2::read_bandwidth, "qmoe_read_bandwidth__avx2"},
    /*quantize_activations_q8=*/
    {&avx2::quantize_activations_q8, "qmoe_quantize_activations_q8__avx2"},
    /*gemm_int4_exact=*/{&avx2::gemm_int4_exact, "qmoe_gemm_int4_exact_8x32__avx2"},
    /*gemm_int4_fast=*/{&avx2::gemm_int4_fast, "qmoe_gemm_int4_fast_8x32__avx2"},
};

}  // namespace qmoe
