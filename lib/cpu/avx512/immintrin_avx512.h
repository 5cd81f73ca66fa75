// <immintrin.h> for the AVX-512 kernel files; include it before anything else that includes
// <immintrin.h>. GCC 12's _mm512_undefined_* (`__m512 __Y = __Y;`) trips -Wmaybe-uninitialized
// and -Wuninitialized wherever an intrinsic passes it as the unused pass-through operand (GCC
// bug 105593, fixed in GCC 13); the suppression is scoped to the header's own lines. Macros and
// a system include only, so it is safe under any tier's flags.
#ifndef QMOE_LIB_CPU_AVX512_IMMINTRIN_AVX512_H_
#define QMOE_LIB_CPU_AVX512_IMMINTRIN_AVX512_H_

#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
#endif
#include <immintrin.h>
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic pop
#endif

#endif  // QMOE_LIB_CPU_AVX512_IMMINTRIN_AVX512_H_
