/* Every bf16 path this CPU has, built the way a user builds (plain -O2, no -march), on
   a product against the naive loop over the same bf16-rounded inputs. gcc 12's
   _tile_loadconfig let -O2 drop the tile configuration's stores without -mamx-tile, so
   the AMX path faulted in such a build while the tests' -march=native builds passed. */
#define PDP_IMPLEMENTATION
#include "pdp.h"

#include <math.h>
#include <stdio.h>

int main(void)
{
    enum { M = 37, N = 70, K = 53 };
    static float a[M * K], b[N * K], c[M * N];
    int i, j, k, p, failed = 0;
    for (i = 0; i < M * K; i++) a[i] = (float)((i * 7) % 13) / 6.0f - 1.0f;
    for (i = 0; i < N * K; i++) b[i] = (float)((i * 5) % 11) / 5.0f - 1.0f;
    for (p = PDP_BF16_PATH_EMULATED; p <= PDP_BF16_PATH_SGEMM; p++) {
        double worst = 0.0;
        if (!pdp_bf16_path_available((pdp_bf16_path)p)) continue;
        pdp_gemm_bf16_on((pdp_bf16_path)p, PDP_NO_TRANS, PDP_TRANS, M, N, K, 1.0f, a, K, b, K, 0.0f,
                         c, N);
        for (i = 0; i < M; i++)
            for (j = 0; j < N; j++) {
                double want = 0.0;
                for (k = 0; k < K; k++)
                    want += (double)pdp_bf16_round(a[i * K + k]) * (double)pdp_bf16_round(b[j * K + k]);
                if (fabs(want - c[i * N + j]) > worst) worst = fabs(want - c[i * N + j]);
            }
        printf("%s: worst %.2e\n", pdp_bf16_path_name((pdp_bf16_path)p), worst);
        failed |= !(worst <= 1e-4);
    }
    return failed;
}
