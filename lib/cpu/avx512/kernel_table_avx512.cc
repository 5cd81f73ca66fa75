// The avx512 kernel table (see lib/kernel_table.h for the invariants).
#include "lib/cpu/avx512/kernels_avx512.h"
#include "lib/kernel_table.h"

namespace qmoe {

const KernelTable kAvx512KernelTable = {
    /*convert_f16_to_f32=*/{&avx512::convert_f16_to_f32, "qmoe_convert_f16_to_f32__avx512"},
    /*convert_f32_to_f16=*/{&avx512::convert_f32_to_f16, "qmoe_convert_f32_to_f16__avx512"},
    /*convert_bf16_to_f32=*/{&avx512::convert_bf16_to_f32, "qmoe_convert_bf16_to_f32__avx512"},
    /*convert_f32_to_bf16=*/{&avx512::convert_f32_to_bf16, "qmoe_convert_f32_to_bf16__avx512"},
    /*read_bandwidth=*/{&avx512::read_bandwidth, "qmoe_read_bandwidth__avx512"},
    // Until the AVX-512 INT4 kernels land, this tier inherits the AVX2 ones.
    /*quantize_activations_q8=*/{nullptr, nullptr},
    /*gemm_int4_exact=*/{nullptr, nullptr},
    /*gemm_int4_fast=*/{nullptr, nullptr},
};

}  // namespace qmoe
