//! Compiles the built-in workload's OpenMP kernels (workload/kernels.c) with
//! -fopenmp and links them into the `threadwise-workload` binary only: the
//! `threadwise` binary itself stays free of C libraries at run time.
//!
//! With `THREADWISE_STATIC_OPENMP=1` (scripts/wheel.sh sets it) the kernels are
//! compiled by GCC whatever the linker is (the wheel links through zig for an
//! old glibc, and zig's clang speaks LLVM's OpenMP ABI, not GNU's), and GCC's
//! own `libgomp.a` is linked in: the workload then carries the real GNU OpenMP
//! runtime (OMP_NUM_THREADS, OMP_PROC_BIND, OMP_WAIT_POLICY, GOMP_SPINCOUNT)
//! and needs no libgomp.so.1 on the machine it runs on. libgomp is GCC's
//! runtime library, which the GCC Runtime Library Exception lets us ship.

use std::path::PathBuf;
use std::process::Command;

fn main() {
    println!("cargo:rerun-if-changed=workload/kernels.c");
    println!("cargo:rerun-if-env-changed=THREADWISE_STATIC_OPENMP");
    println!("cargo:rerun-if-env-changed=THREADWISE_OPENMP_CC");
    let static_omp = std::env::var("THREADWISE_STATIC_OPENMP").is_ok_and(|v| v == "1");
    let mut build = cc::Build::new();
    build
        .file("workload/kernels.c")
        .flag("-fopenmp")
        .opt_level(2)
        .cargo_metadata(false);
    let gcc = std::env::var("THREADWISE_OPENMP_CC").unwrap_or_else(|_| "gcc".into());
    if static_omp {
        build.compiler(&gcc);
    }
    build.compile("twkernels");
    let out = std::env::var("OUT_DIR").expect("cargo sets OUT_DIR");
    println!("cargo:rustc-link-arg-bin=threadwise-workload={out}/libtwkernels.a");
    if static_omp {
        let gomp = static_libgomp(&gcc);
        println!(
            "cargo:rustc-link-arg-bin=threadwise-workload={}",
            gomp.display()
        );
        println!("cargo:rustc-link-arg-bin=threadwise-workload=-lpthread");
        println!("cargo:rustc-link-arg-bin=threadwise-workload=-ldl");
    } else {
        println!("cargo:rustc-link-arg-bin=threadwise-workload=-fopenmp");
    }
    // GCC's aarch64 code calls its outline atomics (__aarch64_ldadd4_acq_rel
    // and the like, chosen at run time between LSE and LL/SC), which live in
    // GCC's own libgcc.a. Rust links with -nodefaultlibs, and zig's linker
    // knows nothing of GCC's: named here, for a native build on Grace, a
    // cross one and the wheel alike.
    if std::env::var("CARGO_CFG_TARGET_ARCH").as_deref() == Ok("aarch64") {
        let compiler = build.get_compiler();
        let cc = compiler.path().to_string_lossy();
        println!(
            "cargo:rustc-link-arg-bin=threadwise-workload={}",
            gcc_file(&cc, "-print-libgcc-file-name").display()
        );
    }
}

/// GCC's static libgomp, or a build error that says what to install.
fn static_libgomp(gcc: &str) -> PathBuf {
    gcc_file(gcc, "-print-file-name=libgomp.a")
}

/// A file of GCC's own (`-print-file-name=...`, `-print-libgcc-file-name`).
fn gcc_file(gcc: &str, ask: &str) -> PathBuf {
    let asked = Command::new(gcc).arg(ask).output().unwrap_or_else(|e| {
        panic!("the workload's link needs GCC ({gcc}) to find its files ({ask}): {e}")
    });
    let path = PathBuf::from(String::from_utf8_lossy(&asked.stdout).trim());
    if !path.is_absolute() || !path.is_file() {
        panic!(
            "the workload's link: {gcc} {ask} printed {path:?}, no file; install GCC's \
             libraries (Debian: libgcc-12-dev, or gcc-aarch64-linux-gnu for aarch64) or \
             set THREADWISE_OPENMP_CC"
        );
    }
    path
}
