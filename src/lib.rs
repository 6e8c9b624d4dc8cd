//! threadwise: topology-aware placement of multi-process training ranks.
//! Data flow: probe -> Topology -> pure plan() -> Plan -> export/run/bind/tune.

pub mod cli;
pub mod cpuset;
pub mod doctor;
pub mod export;
pub mod files;
pub mod host;
pub mod launch;
pub mod measure;
mod names;
pub mod os;
pub mod picture;
pub mod plan;
pub mod top;
pub mod topology;
pub mod tune;
pub mod workload;
