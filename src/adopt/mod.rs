//! Ranks another launcher starts: `bind` applies one rank's slice of the
//! plan under torchrun, srun, mpirun (Open MPI, MPICH, Intel MPI, MVAPICH) or
//! Cray PALS and execs, after `detect` has read who this rank is from the
//! launcher's own variables.

pub(crate) mod bind;
pub(crate) mod detect;
pub(crate) mod holder;
pub(crate) mod slice;
