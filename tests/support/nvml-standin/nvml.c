/* A stand-in for NVIDIA's libnvidia-ml.so.1, for tests only: it exports the
 * NVML calls threadwise makes and answers them from a JSON description named
 * by THREADWISE_NVML_STANDIN (see README.md beside this file). threadwise
 * loads it in place of the real library when THREADWISE_NVML_LIBRARY names
 * it; everything above the library is threadwise's real NVML code path.
 *
 * Build: gcc -shared -fPIC -O2 -o libnvidia-ml.so.1 nvml.c
 */
#define _GNU_SOURCE
#include <ctype.h>
#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

typedef int nvmlReturn_t;
enum {
  OK = 0, UNINIT = 1, INVALID_ARG = 2, NOT_SUPPORTED = 3, NOT_FOUND = 6,
  INSUFFICIENT = 7, DRIVER_NOT_LOADED = 9, UNKNOWN = 999
};

/* ---- a small JSON reader: objects, arrays, strings, numbers, literals ---- */
typedef struct J J;
struct J {
  char type; /* o a s n t f z */
  char *key; /* member name inside an object */
  char *str;
  double num;
  J *kids; /* first child */
  J *next; /* next sibling */
};
static const char *P;
static void ws(void) { while (*P && isspace((unsigned char)*P)) P++; }
static J *node(char t) { J *j = calloc(1, sizeof *j); j->type = t; return j; }
static char *pstr(void) {
  if (*P != '"') return NULL;
  P++;
  size_t cap = 64, n = 0;
  char *s = malloc(cap);
  while (*P && *P != '"') {
    char c = *P++;
    if (c == '\\' && *P) {
      c = *P++;
      if (c == 'n') c = '\n';
      else if (c == 't') c = '\t';
      else if (c == 'u') { P += 4; c = '?'; }
    }
    if (n + 2 > cap) s = realloc(s, cap *= 2);
    s[n++] = c;
  }
  if (*P != '"') { free(s); return NULL; }
  P++;
  s[n] = 0;
  return s;
}
static J *pval(void) {
  ws();
  if (*P == '{' || *P == '[') {
    char close = *P == '{' ? '}' : ']';
    J *j = node(*P == '{' ? 'o' : 'a'), **tail = &j->kids;
    P++;
    ws();
    if (*P == close) { P++; return j; }
    for (;;) {
      char *key = NULL;
      ws();
      if (j->type == 'o') {
        if (!(key = pstr())) return NULL;
        ws();
        if (*P++ != ':') return NULL;
      }
      J *k = pval();
      if (!k) return NULL;
      k->key = key;
      *tail = k;
      tail = &k->next;
      ws();
      if (*P == ',') { P++; continue; }
      if (*P == close) { P++; return j; }
      return NULL;
    }
  }
  if (*P == '"') { J *j = node('s'); return (j->str = pstr()) ? j : NULL; }
  if (!strncmp(P, "true", 4)) { P += 4; return node('t'); }
  if (!strncmp(P, "false", 5)) { P += 5; return node('f'); }
  if (!strncmp(P, "null", 4)) { P += 4; return node('z'); }
  char *end;
  double d = strtod(P, &end);
  if (end == P) return NULL;
  P = end;
  J *j = node('n');
  j->num = d;
  return j;
}
static J *get(J *o, const char *key) {
  for (J *k = o ? o->kids : NULL; k; k = k->next)
    if (k->key && !strcmp(k->key, key)) return k;
  return NULL;
}
static double num(J *o, const char *key, double dflt) {
  J *j = get(o, key);
  return j && j->type == 'n' ? j->num : dflt;
}
static const char *str(J *o, const char *key, const char *dflt) {
  J *j = get(o, key);
  return j && j->type == 's' ? j->str : dflt;
}
static int count(J *a) { int n = 0; for (J *k = a ? a->kids : NULL; k; k = k->next) n++; return n; }
static J *nth(J *a, int i) { J *k = a ? a->kids : NULL; while (k && i--) k = k->next; return k; }

/* ---- devices ---- */
#define MAX_GPUS 64
#define MAX_MIG 8
typedef struct Dev Dev;
struct Dev {
  J *j;
  int is_mig;
  Dev *parent;
  Dev *mig[MAX_MIG];
  int nmig;
};
static J *ROOT;
static Dev GPUS[MAX_GPUS];
static Dev MIGS[MAX_GPUS * MAX_MIG];
static int NGPU, NMIG, INITS;
static struct timespec T0;

static nvmlReturn_t load(void) {
  const char *path = getenv("THREADWISE_NVML_STANDIN");
  if (!path) return DRIVER_NOT_LOADED;
  FILE *f = fopen(path, "r");
  if (!f) return DRIVER_NOT_LOADED;
  static char buf[1 << 20];
  size_t n = fread(buf, 1, sizeof buf - 1, f);
  fclose(f);
  buf[n] = 0;
  P = buf;
  ROOT = pval();
  if (!ROOT || ROOT->type != 'o') return UNKNOWN;
  if (get(ROOT, "driver_loaded") && get(ROOT, "driver_loaded")->type == 'f') return DRIVER_NOT_LOADED;
  J *gpus = get(ROOT, "gpus");
  NGPU = NMIG = 0;
  for (int i = 0; i < count(gpus) && i < MAX_GPUS; i++) {
    Dev *d = &GPUS[NGPU++];
    memset(d, 0, sizeof *d);
    d->j = nth(gpus, i);
    J *mig = get(d->j, "mig");
    for (int m = 0; m < count(mig) && m < MAX_MIG; m++) {
      Dev *x = &MIGS[NMIG++];
      memset(x, 0, sizeof *x);
      x->j = nth(mig, m);
      x->is_mig = 1;
      x->parent = d;
      d->mig[d->nmig++] = x;
    }
  }
  clock_gettime(CLOCK_MONOTONIC, &T0);
  return OK;
}

static Dev *dev(void *h) {
  for (int i = 0; i < NGPU; i++) if (h == &GPUS[i]) return &GPUS[i];
  for (int i = 0; i < NMIG; i++) if (h == &MIGS[i]) return &MIGS[i];
  return NULL;
}
#define DEV(h) Dev *d = INITS ? dev(h) : NULL; if (!INITS) return UNINIT; if (!d) return INVALID_ARG
static int copy(char *dst, unsigned len, const char *src) {
  if (strlen(src) + 1 > len) return INSUFFICIENT;
  strcpy(dst, src);
  return OK;
}

nvmlReturn_t nvmlInit_v2(void) {
  if (INITS) { INITS++; return OK; }
  nvmlReturn_t r = load();
  if (r == OK) INITS = 1;
  return r;
}
nvmlReturn_t nvmlInitWithFlags(unsigned flags) { (void)flags; return nvmlInit_v2(); }
nvmlReturn_t nvmlInit(void) { return nvmlInit_v2(); }
nvmlReturn_t nvmlShutdown(void) { if (!INITS) return UNINIT; INITS--; return OK; }
const char *nvmlErrorString(nvmlReturn_t r) {
  switch (r) {
  case OK: return "Success";
  case UNINIT: return "Uninitialized";
  case INVALID_ARG: return "Invalid Argument";
  case NOT_SUPPORTED: return "Not Supported";
  case NOT_FOUND: return "Not Found";
  case INSUFFICIENT: return "Insufficient Size";
  case DRIVER_NOT_LOADED: return "Driver Not Loaded";
  default: return "Unknown Error";
  }
}
nvmlReturn_t nvmlSystemGetDriverVersion(char *v, unsigned len) {
  if (!INITS) return UNINIT;
  return copy(v, len, str(ROOT, "driver_version", "550.54.15"));
}
nvmlReturn_t nvmlDeviceGetCount_v2(unsigned *n) { if (!INITS) return UNINIT; *n = NGPU; return OK; }
nvmlReturn_t nvmlDeviceGetCount(unsigned *n) { return nvmlDeviceGetCount_v2(n); }
nvmlReturn_t nvmlDeviceGetHandleByIndex_v2(unsigned i, void **h) {
  if (!INITS) return UNINIT;
  if (i >= (unsigned)NGPU) return INVALID_ARG;
  *h = &GPUS[i];
  return OK;
}
nvmlReturn_t nvmlDeviceGetHandleByUUID(const char *uuid, void **h) {
  if (!INITS) return UNINIT;
  for (int i = 0; i < NGPU; i++) if (!strcmp(str(GPUS[i].j, "uuid", ""), uuid)) { *h = &GPUS[i]; return OK; }
  for (int i = 0; i < NMIG; i++) if (!strcmp(str(MIGS[i].j, "uuid", ""), uuid)) { *h = &MIGS[i]; return OK; }
  return NOT_FOUND;
}

typedef struct {
  char busIdLegacy[16];
  unsigned domain, bus, device, pciDeviceId, pciSubSystemId;
  char busId[32];
} nvmlPciInfo_t;
nvmlReturn_t nvmlDeviceGetPciInfo_v3(void *h, nvmlPciInfo_t *p) {
  DEV(h);
  Dev *g = d->is_mig ? d->parent : d;
  const char *id = str(g->j, "bus_id", "0000:00:00.0");
  memset(p, 0, sizeof *p);
  /* NVML writes an 8-digit domain: 00000000:3B:00.0 */
  unsigned dom = 0, bus = 0, slot = 0, fn = 0;
  sscanf(id, "%x:%x:%x.%x", &dom, &bus, &slot, &fn);
  snprintf(p->busId, sizeof p->busId, "%08X:%02X:%02X.%X", dom, bus, slot, fn);
  snprintf(p->busIdLegacy, sizeof p->busIdLegacy, "%04X:%02X:%02X.%X", dom, bus, slot, fn);
  p->domain = dom;
  p->bus = bus;
  p->device = slot;
  p->pciDeviceId = (unsigned)num(g->j, "pci_device_id", 0x20b010de);
  return OK;
}
nvmlReturn_t nvmlDeviceGetPciInfo_v2(void *h, nvmlPciInfo_t *p) { return nvmlDeviceGetPciInfo_v3(h, p); }
nvmlReturn_t nvmlDeviceGetUUID(void *h, char *u, unsigned len) { DEV(h); return copy(u, len, str(d->j, "uuid", "")); }
nvmlReturn_t nvmlDeviceGetName(void *h, char *u, unsigned len) {
  DEV(h);
  return copy(u, len, str(d->j, "name", d->is_mig ? "MIG device" : "NVIDIA A100-SXM4-80GB"));
}
nvmlReturn_t nvmlDeviceGetMinorNumber(void *h, unsigned *m) {
  DEV(h);
  if (d->is_mig) return NOT_SUPPORTED;
  *m = (unsigned)num(d->j, "minor", (double)(d - GPUS));
  return OK;
}
nvmlReturn_t nvmlDeviceGetPersistenceMode(void *h, int *mode) {
  DEV(h);
  J *p = get(d->j, "persistence");
  *mode = !(p && p->type == 'f');
  return OK;
}

/* Utilisation: a number, or a list of numbers each held for step_ms (the
 * list repeats), counted from nvmlInit. */
typedef struct { unsigned gpu, memory; } nvmlUtilization_t;
nvmlReturn_t nvmlDeviceGetUtilizationRates(void *h, nvmlUtilization_t *u) {
  DEV(h);
  if (d->is_mig) return NOT_SUPPORTED;
  J *x = get(d->j, "utilization");
  double v = 0;
  if (x && x->type == 'n') v = x->num;
  else if (x && x->type == 'a' && count(x) > 0) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    double ms = (t.tv_sec - T0.tv_sec) * 1e3 + (t.tv_nsec - T0.tv_nsec) / 1e6;
    long k = (long)(ms / num(d->j, "step_ms", 500)) % count(x);
    v = nth(x, (int)k)->num;
  }
  u->gpu = (unsigned)v;
  u->memory = (unsigned)num(d->j, "memory_utilization", 0);
  return OK;
}

/* The job's processes, as a real driver would see DDP ranks: a process
 * whose environment holds THREADWISE_GPU=<this GPU's bus id> (how threadwise
 * tells a rank its GPU), or, without it, LOCAL_RANK=<this GPU's NVML index>
 * (a script's cuda:LOCAL_RANK), counted once per process tree (the topmost
 * such process: a rank's shell, not its children), each holding
 * job_process_memory_mib; then the listed "processes". Only processes whose
 * THREADWISE_NVML_STANDIN names the same description count. */
typedef struct { unsigned pid; unsigned long long usedGpuMemory; unsigned gpuInstanceId, computeInstanceId; } nvmlProcessInfo_t;
static int env_get(int pid, const char *key, char *val, size_t cap) {
  char path[64];
  static char buf[1 << 17];
  snprintf(path, sizeof path, "/proc/%d/environ", pid);
  FILE *f = fopen(path, "r");
  if (!f) return 0;
  size_t n = fread(buf, 1, sizeof buf - 1, f);
  fclose(f);
  buf[n] = 0;
  size_t klen = strlen(key);
  for (size_t i = 0; i < n; i += strlen(buf + i) + 1)
    if (!strncmp(buf + i, key, klen) && buf[i + klen] == '=') {
      snprintf(val, cap, "%s", buf + i + klen + 1);
      return 1;
    }
  return 0;
}
static int uses(int pid, Dev *d) {
  char v[4096], want[32];
  /* Only processes of the same stand-in machine (the same description):
   * tests running side by side each see their own job. */
  const char *spec = getenv("THREADWISE_NVML_STANDIN");
  if (!spec || !env_get(pid, "THREADWISE_NVML_STANDIN", v, sizeof v) || strcmp(v, spec)) return 0;
  if (env_get(pid, "THREADWISE_GPU", v, sizeof v)) return !strcmp(v, str(d->j, "bus_id", ""));
  snprintf(want, sizeof want, "%d", (int)(d - GPUS));
  return env_get(pid, "LOCAL_RANK", v, sizeof v) && !strcmp(v, want);
}
static int parent_of(int pid) {
  char path[64], buf[1024];
  snprintf(path, sizeof path, "/proc/%d/stat", pid);
  FILE *f = fopen(path, "r");
  if (!f) return 0;
  size_t n = fread(buf, 1, sizeof buf - 1, f);
  fclose(f);
  buf[n] = 0;
  char *p = strrchr(buf, ')');
  int ppid = 0;
  if (p) sscanf(p + 2, "%*c %d", &ppid);
  return ppid;
}
static int procs(Dev *d, nvmlProcessInfo_t *out, int cap) {
  int n = 0;
  const unsigned long long MiB = 1ull << 20;
  double job = num(d->j, "job_process_memory_mib", -1);
  if (job >= 0) {
    DIR *dir = opendir("/proc");
    struct dirent *e;
    while (dir && (e = readdir(dir))) {
      int pid = atoi(e->d_name);
      if (pid > 0 && uses(pid, d) && !uses(parent_of(pid), d)) {
        if (n < cap) { out[n].pid = pid; out[n].usedGpuMemory = (unsigned long long)job * MiB; }
        n++;
      }
    }
    if (dir) closedir(dir);
  }
  J *list = get(d->j, "processes");
  for (int i = 0; i < count(list); i++) {
    J *p = nth(list, i);
    if (n < cap) { out[n].pid = (unsigned)num(p, "pid", 0); out[n].usedGpuMemory = (unsigned long long)num(p, "memory_mib", 0) * MiB; }
    n++;
  }
  for (int i = 0; i < n && i < cap; i++) out[i].gpuInstanceId = out[i].computeInstanceId = 0xFFFFFFFF;
  return n;
}
nvmlReturn_t nvmlDeviceGetComputeRunningProcesses_v3(void *h, unsigned *count_, nvmlProcessInfo_t *infos) {
  DEV(h);
  if (d->is_mig) { *count_ = 0; return OK; }
  int n = procs(d, infos, infos ? (int)*count_ : 0);
  if (!infos || (unsigned)n > *count_) { *count_ = n; return n == 0 && !infos ? OK : INSUFFICIENT; }
  *count_ = n;
  return OK;
}
nvmlReturn_t nvmlDeviceGetGraphicsRunningProcesses_v3(void *h, unsigned *count_, nvmlProcessInfo_t *infos) {
  DEV(h);
  (void)infos;
  *count_ = 0;
  return OK;
}
static unsigned long long used_bytes(Dev *d) {
  nvmlProcessInfo_t p[256];
  int n = procs(d, p, 256);
  unsigned long long used = (unsigned long long)num(d->j, "memory_used_mib", 0) << 20;
  for (int i = 0; i < n && i < 256; i++) used += p[i].usedGpuMemory;
  return used;
}
typedef struct { unsigned version; unsigned long long total, reserved, free, used; } nvmlMemory_v2_t;
typedef struct { unsigned long long total, free, used; } nvmlMemory_t;
nvmlReturn_t nvmlDeviceGetMemoryInfo_v2(void *h, nvmlMemory_v2_t *m) {
  DEV(h);
  unsigned long long total = (unsigned long long)num(d->j, "memory_total_mib", 81920) << 20;
  m->total = total;
  m->reserved = 0;
  m->used = d->is_mig ? 0 : used_bytes(d);
  m->free = total > m->used ? total - m->used : 0;
  return OK;
}
nvmlReturn_t nvmlDeviceGetMemoryInfo(void *h, nvmlMemory_t *m) {
  nvmlMemory_v2_t v;
  nvmlReturn_t r = nvmlDeviceGetMemoryInfo_v2(h, &v);
  if (r == OK) { m->total = v.total; m->free = v.free; m->used = v.used; }
  return r;
}

/* MIG */
nvmlReturn_t nvmlDeviceGetMigMode(void *h, unsigned *current, unsigned *pending) {
  DEV(h);
  if (d->is_mig) return NOT_SUPPORTED;
  *current = *pending = d->nmig > 0;
  return OK;
}
nvmlReturn_t nvmlDeviceGetMaxMigDeviceCount(void *h, unsigned *n) {
  DEV(h);
  *n = d->nmig ? MAX_MIG : 0;
  return OK;
}
nvmlReturn_t nvmlDeviceGetMigDeviceHandleByIndex(void *h, unsigned i, void **mig) {
  DEV(h);
  if (i >= (unsigned)d->nmig) return NOT_FOUND;
  *mig = d->mig[i];
  return OK;
}
nvmlReturn_t nvmlDeviceIsMigDeviceHandle(void *h, unsigned *is) { DEV(h); *is = d->is_mig; return OK; }
nvmlReturn_t nvmlDeviceGetDeviceHandleFromMigDeviceHandle(void *h, void **parent) {
  DEV(h);
  if (!d->is_mig) return INVALID_ARG;
  *parent = d->parent;
  return OK;
}
