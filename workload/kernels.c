/* The built-in workload's compute: a stack of dense layers over a batch, each
 * layer one OpenMP parallel region, like the intra-op parallel kernels PyTorch
 * runs on CPU. Compiled with -fopenmp so it uses the real GNU OpenMP runtime and
 * honours OMP_NUM_THREADS, OMP_PROC_BIND, OMP_WAIT_POLICY. */
#include <omp.h>

/* Run `regions` layers: y = leaky_relu(w * x) for each of `batch` samples of
 * width n; x and y swap roles between layers. Returns a checksum. */
double tw_forward(const float *w, float *x, float *y, int n, int batch, int regions) {
    for (int r = 0; r < regions; r++) {
#pragma omp parallel for schedule(static)
        for (int i = 0; i < n; i++) {
            const float *wi = w + (long)i * n;
            for (int b = 0; b < batch; b++) {
                const float *xb = x + (long)b * n;
                float acc = 0.0f;
                for (int k = 0; k < n; k++)
                    acc += wi[k] * xb[k];
                y[(long)b * n + i] = acc > 0.0f ? acc * 0.5f : acc * 0.01f;
            }
        }
        float *t = x;
        x = y;
        y = t;
    }
    double sum = 0.0;
    for (int k = 0; k < n; k++)
        sum += x[k];
    return sum;
}

/* The gradient-like buffer a step reduces across ranks, filled in parallel. */
void tw_fill(float *g, long len, float v) {
#pragma omp parallel for schedule(static)
    for (long i = 0; i < len; i++)
        g[i] = v * (float)(i % 7);
}

int tw_max_threads(void) { return omp_get_max_threads(); }
