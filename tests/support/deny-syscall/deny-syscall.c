/* Run a command with one system call refused, as a container's seccomp
 * profile or an older kernel refuses it: `deny-syscall NAME ERRNO CMD ARGS...`,
 * NAME one of clone3, close_range, sched_setaffinity, set_mempolicy, mbind;
 * ERRNO one of ENOSYS, EPERM, EACCES.
 * The tests start `threadwise run` under it to take its other paths: ranks
 * that join the job cgroup where clone3 is refused (ENOSYS: a kernel before
 * 5.3 or today's Docker profile; EPERM: older container profiles), and a
 * watchdog that closes its descriptors one by one where close_range is; and
 * the GPU check's dry mode under what a sandbox (gVisor) may refuse:
 * affinity and memory policy.
 * x86_64 and aarch64 syscall numbers come from the kernel headers; the
 * filter checks the architecture first. */
#include <errno.h>
#include <linux/audit.h>
#include <linux/filter.h>
#include <linux/seccomp.h>
#include <stddef.h>
#include <stdio.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <unistd.h>

#if defined(__x86_64__)
#define ARCH AUDIT_ARCH_X86_64
#elif defined(__aarch64__)
#define ARCH AUDIT_ARCH_AARCH64
#else
#error "deny-syscall: unknown architecture"
#endif

#ifndef __NR_clone3
#define __NR_clone3 435
#endif
#ifndef __NR_close_range
#define __NR_close_range 436
#endif

int main(int argc, char **argv) {
    if (argc < 4) {
        fprintf(stderr, "usage: deny-syscall clone3|close_range|sched_setaffinity|set_mempolicy|mbind ENOSYS|EPERM|EACCES CMD [ARGS...]\n");
        return 2;
    }
    unsigned nr, err;
    if (!strcmp(argv[1], "clone3")) nr = __NR_clone3;
    else if (!strcmp(argv[1], "close_range")) nr = __NR_close_range;
    else if (!strcmp(argv[1], "sched_setaffinity")) nr = __NR_sched_setaffinity;
    else if (!strcmp(argv[1], "set_mempolicy")) nr = __NR_set_mempolicy;
    else if (!strcmp(argv[1], "mbind")) nr = __NR_mbind;
    else { fprintf(stderr, "deny-syscall: unknown call %s\n", argv[1]); return 2; }
    if (!strcmp(argv[2], "ENOSYS")) err = ENOSYS;
    else if (!strcmp(argv[2], "EPERM")) err = EPERM;
    else if (!strcmp(argv[2], "EACCES")) err = EACCES;
    else { fprintf(stderr, "deny-syscall: unknown errno %s\n", argv[2]); return 2; }
    struct sock_filter f[] = {
        BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, arch)),
        BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, ARCH, 1, 0),
        BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW),
        BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, nr)),
        BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, nr, 0, 1),
        BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ERRNO | err),
        BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW),
    };
    struct sock_fprog prog = {sizeof f / sizeof f[0], f};
    if (prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) || prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, &prog)) {
        perror("deny-syscall: seccomp");
        return 125;
    }
    execvp(argv[3], argv + 3);
    perror("deny-syscall: exec");
    return 127;
}
