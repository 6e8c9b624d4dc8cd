/* Run a command with clone3(2) refused (ENOSYS), as a container's seccomp
 * profile, or a kernel before 5.3, refuses it: `no-clone3 CMD ARGS...`.
 * The tests start `threadwise run` under it to take its fork-then-join path
 * into the job cgroup. x86_64 and aarch64 syscall numbers come from the
 * kernel headers; other architectures are not filtered by number mismatch
 * because the filter checks the architecture first. */
#include <errno.h>
#include <linux/audit.h>
#include <linux/filter.h>
#include <linux/seccomp.h>
#include <stddef.h>
#include <stdio.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <unistd.h>

#if defined(__x86_64__)
#define ARCH AUDIT_ARCH_X86_64
#elif defined(__aarch64__)
#define ARCH AUDIT_ARCH_AARCH64
#else
#error "no-clone3: unknown architecture"
#endif

#ifndef __NR_clone3
#define __NR_clone3 435
#endif

int main(int argc, char **argv) {
    struct sock_filter f[] = {
        BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, arch)),
        BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, ARCH, 1, 0),
        BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW),
        BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, nr)),
        BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, __NR_clone3, 0, 1),
        BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ERRNO | ENOSYS),
        BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW),
    };
    struct sock_fprog prog = {sizeof f / sizeof f[0], f};
    if (argc < 2) {
        fprintf(stderr, "usage: no-clone3 CMD [ARGS...]\n");
        return 2;
    }
    if (prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) || prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, &prog)) {
        perror("no-clone3: seccomp");
        return 125;
    }
    execvp(argv[1], argv + 1);
    perror("no-clone3: exec");
    return 127;
}
