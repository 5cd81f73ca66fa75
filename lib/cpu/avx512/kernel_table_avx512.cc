// The avx512 kernel table (see lib/cpu/kernel_table.h for the invariants).
#include "lib/cpu/avx512/kernels_avx512.h"
#include "lib/cpu/kernel_table.h"

namespace qmoe {

const KernelTable kAvx512KernelTable = {
    /*convert_f16_to_f32=*/{&avx512::convert_f16_to_f32, "qmoe_convert_f16_to_f32__avx512"},
    /*convert_f32_to_f16=*/{&avx512::convert_f32_to_f16, "qmoe_convert_f32_to_f16__avx512"},
    /*convert_bf16_to_f32=*/{&avx512::convert_bf16_to_f32, "qmoe_convert_bf16_to_f32__avx512"},
    /*convert_f32_to_bf16=*/{&avx512::convert_f32_to_bf16, "qmoe_convert_f32_to_bf16__avx512"},
    /*read_bandwidth=*/{&avx512::read_bandwidth, "qmoe_read_bandwidth__avx512"},
    /*quantize_activations_q8=*/
    {&avx512::quantize_activations_q8, "qmoe_quantize_activations_q8__avx512"},
    /*gemm_int4_exact=*/{&avx512::gemm_int4_exact, "qmoe_gemm_int4_exact_8x32__avx512"},
    /*gemm_int4_fast=*/{&avx512::gemm_int4_fast, "qmoe_gemm_int4_fast_8x32__avx512"},
};

}  // namespace qmoe
