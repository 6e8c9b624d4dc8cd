/* The built-in workload's compute: the layers of a small CNN (3x3 convolutions,
 * batch-norm, ReLU, pooling), forward and backward, each one OpenMP parallel
 * region over an NHWC batch, like the intra-op parallel kernels PyTorch runs on
 * CPU (oneDNN's convolutions and ATen's element-wise loops). Compiled with
 * -fopenmp so it uses the real GNU OpenMP runtime and honours OMP_NUM_THREADS,
 * OMP_PROC_BIND, OMP_WAIT_POLICY and GOMP_SPINCOUNT.
 *
 * Sizes are checked by the caller (src/bin/threadwise-workload.rs). */
#define _GNU_SOURCE
#include <math.h>
#include <pthread.h>
#include <omp.h>
#include <stdlib.h>
#include <string.h>

#define TW_MAX_C 1024
/* ATen runs an element-wise loop on one thread below this many values
 * (at::internal::GRAIN_SIZE) and as a parallel region above it. */
#define GRAIN 32768

#define AT(b, y, x, s, c) ((((long)(b) * (s) + (y)) * (s) + (x)) * (c))

/* out[b,y,x,:] = sum over ky,kx,ci of in[b,y+ky-1,x+kx-1,ci] * w[ky,kx,ci,:]
 * (stride 1, zero padding 1). Parallel over the batch's rows. */
void tw_conv3x3(const float *in, const float *w, float *out, int batch, int s, int cin, int cout) {
#pragma omp parallel for schedule(static)
    for (int row = 0; row < batch * s; row++) {
        int b = row / s, y = row % s;
        float acc[TW_MAX_C];
        for (int x = 0; x < s; x++) {
            for (int co = 0; co < cout; co++)
                acc[co] = 0.0f;
            for (int ky = 0; ky < 3; ky++) {
                int iy = y + ky - 1;
                if (iy < 0 || iy >= s)
                    continue;
                for (int kx = 0; kx < 3; kx++) {
                    int ix = x + kx - 1;
                    if (ix < 0 || ix >= s)
                        continue;
                    const float *ip = in + AT(b, iy, ix, s, cin);
                    const float *wp = w + (long)(ky * 3 + kx) * cin * cout;
                    for (int ci = 0; ci < cin; ci++) {
                        const float a = ip[ci];
                        const float *wr = wp + (long)ci * cout;
                        for (int co = 0; co < cout; co++)
                            acc[co] += a * wr[co];
                    }
                }
            }
            memcpy(out + AT(b, y, x, s, cout), acc, sizeof(float) * cout);
        }
    }
}

static inline void cpu_relax(void) {
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#elif defined(__aarch64__)
    __asm__ __volatile__("yield");
#endif
}

/* The weight gradient: gw[ky,kx,ci,:] = sum over pixels of
 * in[b,y+ky-1,x+kx-1,ci] * gout[b,y,x,:]. As oneDNN's backward-weights
 * convolution does: each thread sums its share of the batch into its own
 * buffer, the threads meet at a spinning barrier inside the region, then they
 * reduce the buffers row by row. */
void tw_conv3x3_gradw(const float *in, const float *gout, float *gw, int batch, int s, int cin,
                      int cout) {
    const long rows = 9L * cin, len = rows * cout;
    int arrived = 0;
    float *part = NULL;
#pragma omp parallel
    {
        const int nthr = omp_get_num_threads(), t = omp_get_thread_num();
#pragma omp single
        part = malloc(sizeof(float) * len * (nthr > 1 ? nthr : 1));
        float *mine = nthr > 1 ? part + t * len : gw;
        for (long i = 0; i < len; i++)
            mine[i] = 0.0f;
        const int b0 = batch * t / nthr, b1 = batch * (t + 1) / nthr;
        for (int b = b0; b < b1; b++)
            for (int y = 0; y < s; y++)
                for (int x = 0; x < s; x++) {
                    const float *go = gout + AT(b, y, x, s, cout);
                    for (int ky = 0; ky < 3; ky++) {
                        int iy = y + ky - 1;
                        if (iy < 0 || iy >= s)
                            continue;
                        for (int kx = 0; kx < 3; kx++) {
                            int ix = x + kx - 1;
                            if (ix < 0 || ix >= s)
                                continue;
                            const float *ip = in + AT(b, iy, ix, s, cin);
                            float *g = mine + (long)(ky * 3 + kx) * cin * cout;
                            for (int ci = 0; ci < cin; ci++) {
                                const float a = ip[ci];
                                float *gr = g + (long)ci * cout;
                                for (int co = 0; co < cout; co++)
                                    gr[co] += a * go[co];
                            }
                        }
                    }
                }
        if (nthr > 1) {
            __atomic_add_fetch(&arrived, 1, __ATOMIC_ACQ_REL);
            while (__atomic_load_n(&arrived, __ATOMIC_ACQUIRE) < nthr)
                cpu_relax();
            const long r0 = rows * t / nthr, r1 = rows * (t + 1) / nthr;
            for (long r = r0; r < r1; r++)
                for (int co = 0; co < cout; co++) {
                    float acc = 0.0f;
                    for (int k = 0; k < nthr; k++)
                        acc += part[k * len + r * cout + co];
                    gw[r * cout + co] = acc;
                }
        }
    }
    free(part);
}

/* The flipped, transposed kernel that turns the input gradient into a forward
 * convolution: wt[ky,kx,co,ci] = w[2-ky,2-kx,ci,co]. */
void tw_flip(const float *w, float *wt, int cin, int cout) {
#pragma omp parallel for schedule(static) if (9L * cin * cout >= GRAIN)
    for (int k = 0; k < 9; k++)
        for (int ci = 0; ci < cin; ci++)
            for (int co = 0; co < cout; co++)
                wt[((long)k * cout + co) * cin + ci] = w[((long)(8 - k) * cin + ci) * cout + co];
}

/* Per-channel sums of a and of a*b over the pixels, one reduction region
 * (per-thread partial sums, then a critical section). */
static void channel_sums(const float *a, const float *b, long pixels, int c, double *sa,
                         double *sab) {
    for (int k = 0; k < c; k++)
        sa[k] = sab[k] = 0.0;
#pragma omp parallel if (pixels * c >= GRAIN)
    {
        double la[TW_MAX_C], lab[TW_MAX_C];
        for (int k = 0; k < c; k++)
            la[k] = lab[k] = 0.0;
#pragma omp for schedule(static)
        for (long p = 0; p < pixels; p++)
            for (int k = 0; k < c; k++) {
                la[k] += a[p * c + k];
                lab[k] += (double)a[p * c + k] * b[p * c + k];
            }
#pragma omp critical
        for (int k = 0; k < c; k++) {
            sa[k] += la[k];
            sab[k] += lab[k];
        }
    }
}

/* Batch-norm statistics: per-channel mean and 1/sqrt(var + eps), one
 * reduction region (like ATen's batch_norm_cpu_collect_stats). */
void tw_bn_stats(const float *x, long pixels, int c, float *mean, float *inv_std) {
    double sum[TW_MAX_C], sq[TW_MAX_C];
    channel_sums(x, x, pixels, c, sum, sq);
    for (int k = 0; k < c; k++) {
        double m = sum[k] / (double)pixels;
        double v = sq[k] / (double)pixels - m * m;
        mean[k] = (float)m;
        inv_std[k] = (float)(1.0 / sqrt((v > 0.0 ? v : 0.0) + 1e-5));
    }
}

/* x = (x - mean) * inv_std, in place, per channel (batch-norm's apply). */
void tw_bn_apply(float *x, long pixels, int c, const float *mean, const float *inv_std) {
#pragma omp parallel for schedule(static) if (pixels * c >= GRAIN)
    for (long p = 0; p < pixels; p++) {
        float *xp = x + p * c;
        for (int k = 0; k < c; k++)
            xp[k] = (xp[k] - mean[k]) * inv_std[k];
    }
}

/* out = max(x, 0). */
void tw_relu(const float *x, float *out, long n) {
#pragma omp parallel for schedule(static) if (n >= GRAIN)
    for (long i = 0; i < n; i++)
        out[i] = x[i] > 0.0f ? x[i] : 0.0f;
}

/* out = x + y (a residual connection, or a gradient from two branches);
 * out may be x. */
void tw_add(const float *x, const float *y, float *out, long n) {
#pragma omp parallel for schedule(static) if (n >= GRAIN)
    for (long i = 0; i < n; i++)
        out[i] = x[i] + y[i];
}

/* ReLU's gradient: g = 0 where the activation was not positive. */
void tw_relu_back(const float *act, float *g, long n) {
#pragma omp parallel for schedule(static) if (n >= GRAIN)
    for (long i = 0; i < n; i++)
        if (!(act[i] > 0.0f))
            g[i] = 0.0f;
}

/* Batch-norm's gradient, as ATen computes it: a per-channel reduction of g
 * and g*xhat (one region), then g = inv_std * (g - mean(g) - xhat * mean(g*xhat))
 * (another). `xhat` is the normalised activation. */
void tw_bn_back(const float *xhat, float *g, long pixels, int c, const float *inv_std) {
    double sg[TW_MAX_C], sgx[TW_MAX_C];
    channel_sums(g, xhat, pixels, c, sg, sgx);
    float mg[TW_MAX_C], mgx[TW_MAX_C];
    for (int k = 0; k < c; k++) {
        mg[k] = (float)(sg[k] / (double)pixels);
        mgx[k] = (float)(sgx[k] / (double)pixels);
    }
#pragma omp parallel for schedule(static) if (pixels * c >= GRAIN)
    for (long p = 0; p < pixels; p++)
        for (int k = 0; k < c; k++) {
            long i = p * c + k;
            g[i] = inv_std[k] * (g[i] - mg[k] - xhat[i] * mgx[k]);
        }
}

/* 2x2 average pooling, s to s/2 (s even). */
void tw_pool2(const float *in, float *out, int batch, int s, int c) {
    int h = s / 2;
#pragma omp parallel for schedule(static) if ((long)batch * s * s * c >= GRAIN)
    for (int row = 0; row < batch * h; row++) {
        int b = row / h, y = row % h;
        for (int x = 0; x < h; x++) {
            const float *a = in + AT(b, 2 * y, 2 * x, s, c), *bq = a + c;
            const float *cq = in + AT(b, 2 * y + 1, 2 * x, s, c), *d = cq + c;
            float *o = out + AT(b, y, x, h, c);
            for (int k = 0; k < c; k++)
                o[k] = 0.25f * (a[k] + bq[k] + cq[k] + d[k]);
        }
    }
}

/* Its gradient: each input pixel gets a quarter of its output's. */
void tw_pool2_back(const float *gout, float *gin, int batch, int s, int c) {
    int h = s / 2;
#pragma omp parallel for schedule(static) if ((long)batch * s * s * c >= GRAIN)
    for (int row = 0; row < batch * s; row++) {
        int b = row / s, y = row % s;
        for (int x = 0; x < s; x++) {
            const float *g = gout + AT(b, y / 2, x / 2, h, c);
            float *o = gin + AT(b, y, x, s, c);
            for (int k = 0; k < c; k++)
                o[k] = 0.25f * g[k];
        }
    }
}

/* SGD with momentum over one layer's weights (the optimizer step). */
void tw_sgd(float *w, float *mom, const float *g, long n, float lr) {
#pragma omp parallel for schedule(static) if (n >= GRAIN)
    for (long i = 0; i < n; i++) {
        mom[i] = 0.9f * mom[i] + g[i];
        w[i] -= lr * mom[i];
    }
}

int tw_max_threads(void) { return omp_get_max_threads(); }

/* Start the team and name its threads (not the master, the process's main
 * thread) "tw_intra_op", so that threadwise reads their role from evidence:
 * GNU OpenMP names none of its threads. */
void tw_name_team(void) {
#pragma omp parallel
    {
        if (omp_get_thread_num() != 0) pthread_setname_np(pthread_self(), "tw_intra_op");
    }
}
void tw_set_threads(int n) { omp_set_num_threads(n); }
