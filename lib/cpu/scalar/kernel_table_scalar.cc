// The scalar kernel table (see lib/cpu/kernel_table.h for the invariants).
#include "lib/cpu/kernel_table.h"
#include "lib/cpu/scalar/kernels_scalar.h"

namespace qmoe {

const KernelTable kScalarKernelTable = {
    /*convert_f16_to_f32=*/{&scalar::convert_f16_to_f32, "qmoe_convert_f16_to_f32__scalar"},
    /*convert_f32_to_f16=*/{&scalar::convert_f32_to_f16, "qmoe_convert_f32_to_f16__scalar"},
    /*convert_bf16_to_f32=*/{&scalar::convert_bf16_to_f32, "qmoe_convert_bf16_to_f32__scalar"},
    /*convert_f32_to_bf16=*/{&scalar::convert_f32_to_bf16, "qmoe_convert_f32_to_bf16__scalar"},
    /*read_bandwidth=*/{&scalar::read_bandwidth, "qmoe_read_bandwidth__scalar"},
    /*quantize_activations_q8=*/
    {&scalar::quantize_activations_q8, "qmoe_quantize_activations_q8__scalar"},
    /*gemm_int4_exact=*/{&scalar::gemm_int4_exact, "qmoe_gemm_int4_exact_8x32__scalar"},
    /*gemm_int4_fast=*/{&scalar::gemm_int4_fast, "qmoe_gemm_int4_fast_8x32__scalar"},
};

}  // namespace qmoe
