//! Compiles the built-in workload's OpenMP kernels (workload/kernels.c) with
//! -fopenmp and links them into the `threadwise-workload` binary only: the
//! `threadwise` binary itself stays free of C libraries at run time.

fn main() {
    println!("cargo:rerun-if-changed=workload/kernels.c");
    cc::Build::new()
        .file("workload/kernels.c")
        .flag("-fopenmp")
        .opt_level(2)
        .cargo_metadata(false)
        .compile("twkernels");
    let out = std::env::var("OUT_DIR").expect("cargo sets OUT_DIR");
    println!("cargo:rustc-link-arg-bin=threadwise-workload={out}/libtwkernels.a");
    println!("cargo:rustc-link-arg-bin=threadwise-workload=-fopenmp");
}
