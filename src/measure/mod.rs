//! Measuring what runs, the one reader of live processes and of the machine's
//! load: `process` (one-shot reads of /proc/PID for launch and top), `proc`
//! (the sampler `top` polls: threads, CPU, context switches, NUMA pages) and
//! `gpu` (NVML, loaded at run time so the binary needs no NVIDIA library),
//! and `throughput` (the rate a job prints, by `rates`' rules or the user's
//! `--metric`), read by tune's trials and by a node agent's report alike.

pub(crate) mod gpu;
pub(crate) mod proc;
pub(crate) mod process;
pub(crate) mod rates;
pub(crate) mod throughput;
pub(crate) mod usage;
