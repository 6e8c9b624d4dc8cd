//! Measuring what runs: GPU utilisation and memory through NVML, loaded at run
//! time so the binary needs no NVIDIA library to start.

pub mod gpu;
