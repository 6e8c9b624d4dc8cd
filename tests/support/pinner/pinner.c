/* A rank whose threads choose their own CPUs, for the holder's rules
 * (tests/integration/holding.rs). Modes:
 *   omp     an OpenMP team of 2 (OMP_PROC_BIND/OMP_PLACES from the
 *           environment); each thread watches its mask for 1.5 s:
 *           "pinner: omp N start S end E changed C"
 *   pin     a thread waits until the holder placed it (its mask changed),
 *           pins itself to the rank's first CPU, and watches 1.5 s:
 *           "pinner: pin on S moved M"
 *   repin   as pin, but re-pins itself to the rank's whole set every 100 ms
 *           for 2 s: "pinner: repin moved-back M"
 *   wide    a thread re-pins itself to every CPU every 100 ms; it counts
 *           the times it was put back, until WANT (argv[2]) put-backs, then
 *           2 s more: "pinner: wide put-back N"
 *   leave   a thread moves itself to every CPU once and stays 2 s:
 *           "pinner: leave stayed yes|no"
 * Every wait is for an event, bounded at 30 s (then the line says so).
 * If PINNER_DONE names a file, the process waits for it before it ends. */
#define _GNU_SOURCE
#include <omp.h>
#include <pthread.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

static cpu_set_t rank_set; /* the process's mask at start */
static int want = 3;

static double now(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return t.tv_sec + t.tv_nsec / 1e9;
}

static void list(const cpu_set_t *s, char *out, size_t n) {
  out[0] = 0;
  for (int c = 0; c < CPU_SETSIZE; c++)
    if (CPU_ISSET(c, s)) {
      size_t l = strlen(out);
      snprintf(out + l, n - l, "%s%d", l ? "," : "", c);
    }
}

static void mine(cpu_set_t *s) { sched_getaffinity(0, sizeof *s, s); }

static int first_cpu(const cpu_set_t *s) {
  for (int c = 0; c < CPU_SETSIZE; c++)
    if (CPU_ISSET(c, s)) return c;
  return 0;
}

/* Wait until this thread's mask is no longer `from` (the holder placed it). */
static int wait_moved(const cpu_set_t *from) {
  double end = now() + 30;
  cpu_set_t m;
  while (now() < end) {
    mine(&m);
    if (!CPU_EQUAL(&m, from)) return 1;
    usleep(5000);
  }
  return 0;
}

static void *pin(void *arg) {
  int repin = arg != NULL;
  cpu_set_t start, one, m;
  mine(&start);
  if (!wait_moved(&start)) {
    printf("pinner: never placed\n");
    return NULL;
  }
  if (repin) {
    int moved = 0;
    double end = now() + 2;
    while (now() < end) {
      mine(&m);
      if (!CPU_EQUAL(&m, &rank_set)) moved++;
      sched_setaffinity(0, sizeof rank_set, &rank_set);
      usleep(100000);
    }
    printf("pinner: repin moved-back %d\n", moved - 1);
    return NULL;
  }
  CPU_ZERO(&one);
  CPU_SET(first_cpu(&rank_set), &one);
  sched_setaffinity(0, sizeof one, &one);
  int moved = 0;
  double end = now() + 1.5;
  while (now() < end) {
    mine(&m);
    if (!CPU_EQUAL(&m, &one)) moved++;
    usleep(5000);
  }
  char s[256];
  list(&one, s, sizeof s);
  printf("pinner: pin on %s moved %d\n", s, moved);
  return NULL;
}

static void all_cpus(cpu_set_t *s) {
  CPU_ZERO(s);
  long n = sysconf(_SC_NPROCESSORS_CONF);
  for (long c = 0; c < n; c++) CPU_SET(c, s);
}

static void *wide(void *arg) {
  (void)arg;
  cpu_set_t all, m;
  all_cpus(&all);
  int back = 0;
  double end = now() + 30, stop = 0;
  sched_setaffinity(0, sizeof all, &all);
  while (now() < end && (stop == 0 || now() < stop)) {
    usleep(100000);
    mine(&m);
    if (!CPU_EQUAL(&m, &all)) {
      back++;
      sched_setaffinity(0, sizeof all, &all);
      if (back == want) stop = now() + 2;
    }
  }
  printf("pinner: wide put-back %d\n", back);
  return NULL;
}

static void *leave(void *arg) {
  (void)arg;
  cpu_set_t all, m;
  all_cpus(&all);
  sched_setaffinity(0, sizeof all, &all);
  int stayed = 1;
  double end = now() + 2;
  while (now() < end) {
    mine(&m);
    if (!CPU_EQUAL(&m, &all)) stayed = 0;
    usleep(20000);
  }
  printf("pinner: leave stayed %s\n", stayed ? "yes" : "no");
  return NULL;
}

static void omp(void) {
#pragma omp parallel num_threads(2)
  {
    cpu_set_t start, m;
    mine(&start);
    int changed = 0;
    double end = now() + 1.5;
    while (now() < end) {
      mine(&m);
      if (!CPU_EQUAL(&m, &start)) changed++;
      usleep(5000);
    }
    char a[256], b[256];
    list(&start, a, sizeof a);
    list(&m, b, sizeof b);
#pragma omp critical
    printf("pinner: omp %d start %s end %s changed %d\n", omp_get_thread_num(), a, b,
           changed);
  }
}

int main(int argc, char **argv) {
  setvbuf(stdout, NULL, _IOLBF, 0);
  mine(&rank_set);
  const char *mode = argc > 1 ? argv[1] : "";
  if (argc > 2) want = atoi(argv[2]);
  pthread_t t;
  if (!strcmp(mode, "omp")) {
    omp();
  } else {
    void *(*f)(void *) = !strcmp(mode, "wide")    ? wide
                         : !strcmp(mode, "leave") ? leave
                                                  : pin;
    pthread_create(&t, NULL, f, !strcmp(mode, "repin") ? (void *)1 : NULL);
    pthread_setname_np(t, "pinner");
    pthread_join(t, NULL);
  }
  const char *done = getenv("PINNER_DONE");
  if (done) {
    double end = now() + 60;
    while (access(done, F_OK) != 0 && now() < end) usleep(20000);
  }
  return 0;
}
