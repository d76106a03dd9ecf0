// NCCL for the TP group's collectives, one process per GPU (mpirun -n N nanoplan run --backend
// cuda): all-gather, reduce-scatter and all-reduce run on the device through NCCL; pipeline
// transfers and the tied-embedding exchange stay on the MPI communicator it wraps (host staging,
// non-blocking sends: no send/recv ordering deadlock between pipeline neighbours).
//
// Determinism, stated honestly: NCCL does not promise the order of a sum over ranks (its ring and
// tree algorithms differ, and it may pick either), so a run over NCCL is not bit for bit the
// in-process run: losses and gradients agree within the bf16 tolerance of the executor's
// TP-versus-single-rank checks. All-gathers and pipeline transfers move bytes unchanged (bitwise).
// Built when CMake finds NCCL; it needs a GPU per process.
#pragma once
#include <functional>
#include <memory>

#include "executor/comm/comm.hpp"

namespace np::cuda {

// Wraps the rank's MPI communicator: `broadcast` sends bytes from the TP group's rank 0 to the
// group (for NCCL's unique id). The device memory NCCL takes at its initialisation is measured
// (cudaMemGetInfo) and reported through measured_overheads().
std::unique_ptr<exec::Communicator> make_nccl_comm(exec::Communicator& mpi,
                                                   const std::function<void(void*, int)>& broadcast);

}  // namespace np::cuda
