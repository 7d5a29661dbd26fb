// A quantizer whose matmul returns bool: the member, its signature and the type it returns.
// expect: infer::Quantizer: `static void matmul\(BackendTraits<B>::matmul_context&, const linear<B>&
// expect: returns<bool, void>
#include "infer/quant/f32.hpp"

struct CheckedF32 : infer::F32 {
  static bool matmul(infer::cpu, const linear<infer::cpu>& w, const float* x, std::int32_t rows, float* y) {
    infer::F32::matmul(infer::cpu{}, w, x, rows, y);
    return true;
  }
};

static_assert(infer::diagnose_quantizer<CheckedF32, infer::cpu>());
