//! Measuring what runs, the one reader of live processes and of the machine's
//! load: `process` (one-shot reads of /proc/PID for launch and top), `proc`
//! (the sampler `top` polls: threads, CPU, context switches, NUMA pages) and
//! `gpu` (NVML, loaded at run time so the binary needs no NVIDIA library).

pub mod gpu;
pub mod proc;
pub mod process;
