/* The NUMA guests' rank: touches a buffer of MiB (argv[1], default 256)
 * and prints where the kernel put its pages: the buffer's line of
 * /proc/self/numa_maps (the anonymous mapping with the most pages), as the
 * share on each node, with its policy and CPUs; with --worker, a forked
 * worker says which CPUs it was moved onto. In C, so it runs in the aarch64
 * guest too (no Python there), built static:
 *   gcc -O2 -o touch scripts/numa_guest/touch.c                 (numa-guest.sh)
 *   aarch64-linux-gnu-gcc -O2 -static -o touch ...              (aarch64-guest.sh) */
#define _GNU_SOURCE
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

static void cpus(char *out, size_t n) {
  cpu_set_t set;
  size_t used = 0;
  out[0] = 0;
  if (sched_getaffinity(0, sizeof set, &set) != 0) return;
  for (int c = 0; c < CPU_SETSIZE && used + 8 < n; c++)
    if (CPU_ISSET(c, &set)) used += snprintf(out + used, n - used, "%s%d", used ? "," : "", c);
}

static const char *env(const char *k) {
  const char *v = getenv(k);
  return v ? v : "-";
}

int main(int argc, char **argv) {
  long mib = argc > 1 && argv[1][0] != '-' ? atol(argv[1]) : 256;
  int worker = 0;
  for (int i = 1; i < argc; i++) worker |= strcmp(argv[i], "--worker") == 0;
  pid_t child = -1;
  if (worker && (child = fork()) == 0) {
    /* A DataLoader-like worker: `run` moves it onto THREADWISE_WORKER_CPUS. */
    usleep(600000);
    char got[4096];
    cpus(got, sizeof got);
    printf("numa worker of rank %s cpus %s planned %s\n", env("RANK"), got, env("THREADWISE_WORKER_CPUS"));
    fflush(stdout);
    _exit(0);
  }
  size_t len = (size_t)mib << 20;
  volatile char *buf = malloc(len);
  if (!buf) { perror("touch: malloc"); return 1; }
  for (size_t i = 0; i < len; i += 4096) buf[i] = 1;

  FILE *f = fopen("/proc/self/numa_maps", "r");
  if (!f) { perror("touch: /proc/self/numa_maps"); return 1; }
  char line[8192], best[8192] = "", policy[256] = "";
  long most = -1;
  while (fgets(line, sizeof line, f)) {
    char *a = strstr(line, " anon=");
    if (a && atol(a + 6) > most) {
      most = atol(a + 6);
      strcpy(best, line);
      sscanf(line, "%*s %255s", policy);
    }
  }
  fclose(f);
  if (most < 0) { fprintf(stderr, "touch: no anonymous mapping in numa_maps\n"); return 1; }
  long pages[64] = {0}, total = 0;
  for (char *t = strtok(best, " \n"); t; t = strtok(NULL, " \n")) {
    int node;
    long count;
    if (sscanf(t, "N%d=%ld", &node, &count) == 2 && node >= 0 && node < 64) { pages[node] = count; total += count; }
  }
  if (worker) waitpid(child, NULL, 0);
  char shares[2048] = "", got[4096];
  size_t used = 0;
  for (int n = 0; n < 64; n++)
    if (pages[n]) used += snprintf(shares + used, sizeof shares - used, "%sN%d=%.1f%%", used ? " " : "", n, 100.0 * pages[n] / total);
  cpus(got, sizeof got);
  printf("numa rank %s nodes %s policy %s pages %ld %s cpus %s\n", env("RANK"), env("THREADWISE_NUMA_NODES"), policy, total, shares, got);
  return 0;
}
