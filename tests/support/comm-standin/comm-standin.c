/* A stand-in for a GPU communication library (NCCL) at the interface that
 * matters to thread placement: the syscalls. LD_PRELOAD it into a rank; its
 * constructor does what NCCL's init does to the caller's threads:
 *
 *   STANDIN_STYLE=2.29  pins the calling thread to "its GPU's CPUs"
 *                       (STANDIN_GPU_CPUS, a list like 0-3; default every
 *                       online CPU) and leaves it so (the leak NCCL 2.29 had),
 *                       then starts its named threads, which inherit that mask;
 *                       after 300 ms one of them pins itself there again (a
 *                       library re-pinning later).
 *   STANDIN_STYLE=2.30  pins the caller there for 30 ms of "init", restores
 *                       the caller's own mask, then starts its threads.
 *
 * Threads: "NCCL Service  0", "NCCL Progress 0" (names NCCL 2.30.7 gives) and
 * one unnamed helper. A watcher thread measures, from inside, how long each
 * thread stays outside the caller's original mask and prints one line per
 * thread to stderr, with its longest time outside and how often it left:
 *   standin: tid N 'NAME' outside for S s at most, K time(s) (back: yes|no), mask now LIST
 * at STANDIN_SECONDS (default 3), then the process goes on (the program it
 * was preloaded into runs as usual).
 */
#define _GNU_SOURCE
#include <pthread.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#define NT 4
static pid_t tids[NT];
static const char *names[NT] = {"main", "NCCL Service  0", "NCCL Progress 0", "helper"};
static cpu_set_t original, gpu;
static double outside_since[NT], outside_longest[NT];
static int was_outside[NT], times_outside[NT];

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec / 1e9;
}

static void parse_list(const char *s, cpu_set_t *set) {
    CPU_ZERO(set);
    while (*s) {
        char *end;
        long a = strtol(s, &end, 10), b = a;
        if (*end == '-') b = strtol(end + 1, &end, 10);
        for (long c = a; c <= b && c < CPU_SETSIZE; c++) CPU_SET(c, set);
        s = *end == ',' ? end + 1 : end;
        if (end == s && *s) break;
    }
}

static void list(const cpu_set_t *set, char *out, size_t n) {
    size_t len = 0;
    out[0] = 0;
    for (int c = 0; c < CPU_SETSIZE && len + 8 < n; c++)
        if (CPU_ISSET(c, set)) len += snprintf(out + len, n - len, len ? ",%d" : "%d", c);
}

static int inside(pid_t tid) {
    cpu_set_t m;
    if (sched_getaffinity(tid, sizeof m, &m) != 0) return 1;
    cpu_set_t and;
    CPU_AND(&and, &m, &original);
    return CPU_EQUAL(&and, &m);
}

static volatile int stop;

static void *work(void *arg) {
    long i = (long)arg;
    tids[i] = (pid_t)syscall(SYS_gettid);
    if (i < 3) pthread_setname_np(pthread_self(), names[i]);
    double start = now();
    int repinned = 0;
    while (!stop) {
        volatile double x = 0;
        for (int k = 0; k < 20000; k++) x += k;
        usleep(10000);
        if (i == 1 && !repinned && now() - start > 0.3 && getenv("STANDIN_STYLE") &&
            strcmp(getenv("STANDIN_STYLE"), "2.29") == 0) {
            sched_setaffinity(0, sizeof gpu, &gpu);
            repinned = 1;
        }
    }
    return NULL;
}

static void *watch(void *arg) {
    double seconds = *(double *)arg, start = now();
    while (now() - start < seconds) {
        for (int i = 0; i < NT; i++) {
            if (!tids[i]) continue;
            int in = inside(tids[i]);
            if (!in && !was_outside[i]) {
                was_outside[i] = 1;
                times_outside[i]++;
                outside_since[i] = now();
            }
            if (in && was_outside[i]) {
                was_outside[i] = 0;
                double t = now() - outside_since[i];
                if (t > outside_longest[i]) outside_longest[i] = t;
            }
        }
        usleep(5000);
    }
    for (int i = 0; i < NT; i++) {
        double t = outside_longest[i];
        if (was_outside[i] && now() - outside_since[i] > t) t = now() - outside_since[i];
        cpu_set_t m;
        char l[256];
        sched_getaffinity(tids[i], sizeof m, &m);
        list(&m, l, sizeof l);
        fprintf(stderr,
                "standin: tid %d '%s' outside for %.3f s at most, %d time(s) (back: %s), "
                "mask now %s\n",
                tids[i], names[i], t, times_outside[i], was_outside[i] ? "no" : "yes", l);
    }
    stop = 1;
    return NULL;
}

__attribute__((constructor)) static void init(void) {
    const char *style = getenv("STANDIN_STYLE");
    if (!style) return;
    static double seconds = 3;
    if (getenv("STANDIN_SECONDS")) seconds = atof(getenv("STANDIN_SECONDS"));
    tids[0] = getpid();
    sched_getaffinity(0, sizeof original, &original);
    if (getenv("STANDIN_GPU_CPUS")) {
        parse_list(getenv("STANDIN_GPU_CPUS"), &gpu);
    } else {
        CPU_ZERO(&gpu);
        for (long c = 0; c < sysconf(_SC_NPROCESSORS_ONLN); c++) CPU_SET(c, &gpu);
    }
    pthread_t t;
    /* The watcher first, on the caller's own mask. */
    pthread_create(&t, NULL, watch, &seconds);
    pthread_detach(t);
    sched_setaffinity(0, sizeof gpu, &gpu);
    if (strcmp(style, "2.30") == 0) {
        usleep(30000);
        sched_setaffinity(0, sizeof original, &original);
    }
    for (long i = 1; i < NT; i++) {
        pthread_create(&t, NULL, work, (void *)i);
        pthread_detach(t);
    }
    /* The threads' ids before the caller goes on. */
    for (int k = 0; k < 100; k++) {
        int all = 1;
        for (int i = 1; i < NT; i++) all &= tids[i] != 0;
        if (all) break;
        usleep(1000);
    }
}
