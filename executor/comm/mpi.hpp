// One process per rank: `mpirun -n N nanoplan run ...` runs rank p (pipeline stage p / (dp tp), DP
// rank p / tp mod dp, TP rank p mod tp) in process p, on an MPI communicator, and gathers every
// rank's report to process 0, which compares and prints. Collectives keep the in-process world's arithmetic (each rank gathers
// the group's buffers and sums them in rank order in fp32), so losses and gradients are bitwise
// those of the in-process run. Built when CMake finds MPI (it prints "MPI found/not found").
#pragma once
#include <functional>
#include <memory>
#include <optional>

#include "executor/comm/inproc.hpp"
#include "executor/runner.hpp"

namespace np::exec::mpi {

// Whether this process was started by an MPI launcher (mpirun, srun) with more than one process.
bool launched();

// MPI_Init (once; threads funnelled to the main thread) and this process's rank and world size.
struct Process {
  int rank = 0, size = 1;
};
Process init(int* argc, char*** argv);
// MPI_Finalize, once, if init ran.
void finalize();
// Process 0's exit code, on every process.
int broadcast_exit_code(int code);

// Builds the communicator a rank runs with from its MPI one (which keeps the pipeline transfers):
// NCCL for the TP collectives, say. `broadcast(data, bytes)` sends bytes from the TP group's rank 0
// to every rank of the group.
using CommWrap = std::function<std::unique_ptr<Communicator>(
    Communicator& mpi, const std::function<void(void*, int)>& broadcast)>;

// Runs this process's rank. Process 0 gets the merged RunResult of every rank (sorted by global
// rank); the others get std::nullopt. The world must have exactly tp x pp x dp processes (an Error on
// every process otherwise). A rank that runs out of memory or fails prints its one line and ends
// the job (MPI_Abort with exit code 3 or 4): its peers may wait in a collective for it.
// `transfer` moves bytes between the backend's memory and host staging.
Result<std::optional<RunResult>> run_schedule(const Schedule& s, const BackendFactory& backend,
                                              const RunOptions& options,
                                              std::shared_ptr<Transfer> transfer = host_transfer(),
                                              const CommWrap& wrap = nullptr);

}  // namespace np::exec::mpi
