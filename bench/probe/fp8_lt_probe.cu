// Which cuBLASLt FP8 configurations does this GPU's cuBLASLt accept? (issue 18: Gemm::run_e4m3's outer-vector
// scales were refused with CUBLAS_STATUS_INVALID_VALUE on an H100, CUDA 13.0.) Prints one line per try.
#include <cublasLt.h>
#include <cstdio>
#include <cstdint>
static const char* st(cublasStatus_t s) { return cublasGetStatusName(s); }
int main() {
  cublasLtHandle_t h; cublasLtCreate(&h);
  int ver = (int)cublasLtGetVersion(); std::printf("cublasLt version %d\n", ver);
  const int Ms[] = {9, 64, 256};
  const char* names[] = {"scalar", "outer both", "vec128 both", "blk A vec128 B", "alpha vector", "vec128 A, scalar B"};
  for (int mode = 0; mode < 6; ++mode)
    for (int red = 1; red < 2; ++red)
      for (int M : Ms) {
        const int N = 1024, K = 4096;
        cublasLtMatmulDesc_t d; cublasLtMatmulDescCreate(&d, CUBLAS_COMPUTE_32F, CUDA_R_32F);
        cublasOperation_t t = CUBLAS_OP_T, n = CUBLAS_OP_N;
        cublasLtMatmulDescSetAttribute(d, CUBLASLT_MATMUL_DESC_TRANSA, &t, sizeof t);
        cublasLtMatmulDescSetAttribute(d, CUBLASLT_MATMUL_DESC_TRANSB, &n, sizeof n);
        int32_t outer = CUBLASLT_MATMUL_MATRIX_SCALE_OUTER_VEC_32F, v128 = CUBLASLT_MATMUL_MATRIX_SCALE_VEC128_32F,
                blk = CUBLASLT_MATMUL_MATRIX_SCALE_BLK128x128_32F;
        if (mode == 1) { cublasLtMatmulDescSetAttribute(d, CUBLASLT_MATMUL_DESC_A_SCALE_MODE, &outer, 4); cublasLtMatmulDescSetAttribute(d, CUBLASLT_MATMUL_DESC_B_SCALE_MODE, &outer, 4); }
        if (mode == 2) { cublasLtMatmulDescSetAttribute(d, CUBLASLT_MATMUL_DESC_A_SCALE_MODE, &v128, 4); cublasLtMatmulDescSetAttribute(d, CUBLASLT_MATMUL_DESC_B_SCALE_MODE, &v128, 4); }
        if (mode == 3) { cublasLtMatmulDescSetAttribute(d, CUBLASLT_MATMUL_DESC_A_SCALE_MODE, &blk, 4); cublasLtMatmulDescSetAttribute(d, CUBLASLT_MATMUL_DESC_B_SCALE_MODE, &v128, 4); }
        if (mode == 4) { cublasLtPointerMode_t pm = CUBLASLT_POINTER_MODE_ALPHA_DEVICE_VECTOR_BETA_ZERO; cublasLtMatmulDescSetAttribute(d, CUBLASLT_MATMUL_DESC_POINTER_MODE, &pm, sizeof pm); }
        if (mode == 5) { cublasLtMatmulDescSetAttribute(d, CUBLASLT_MATMUL_DESC_A_SCALE_MODE, &v128, 4); }
        cublasLtMatrixLayout_t a, b, c;
        cublasLtMatrixLayoutCreate(&a, CUDA_R_8F_E4M3, K, N, K);
        cublasLtMatrixLayoutCreate(&b, CUDA_R_8F_E4M3, K, M, K);
        cublasLtMatrixLayoutCreate(&c, CUDA_R_16BF, N, M, N);
        cublasLtMatmulPreference_t p; cublasLtMatmulPreferenceCreate(&p);
        uint64_t ws = 32 << 20; cublasLtMatmulPreferenceSetAttribute(p, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof ws);
        if (red) {
          uint32_t r = CUBLASLT_REDUCTION_SCHEME_NONE | CUBLASLT_REDUCTION_SCHEME_COMPUTE_TYPE;
          cublasLtMatmulPreferenceSetAttribute(p, CUBLASLT_MATMUL_PREF_REDUCTION_SCHEME_MASK, &r, sizeof r);
        }
        cublasLtMatmulHeuristicResult_t res[8]; int found = 0;
        cublasStatus_t s = cublasLtMatmulAlgoGetHeuristic(h, d, a, b, c, c, p, 8, res, &found);
        std::printf("scales %-20s reduction-mask %d M=%4d: %s, %d algorithms\n",
                    names[mode], red, M, st(s), found);
        cublasLtMatmulPreferenceDestroy(p); cublasLtMatrixLayoutDestroy(a); cublasLtMatrixLayoutDestroy(b);
        cublasLtMatrixLayoutDestroy(c); cublasLtMatmulDescDestroy(d);
      }
  return 0;
}
