// The emulation build of executor/cuda/nccl.cu, over the NCCL emulation (nccl_emu.hpp).
#include "executor/cuda/nccl.cu"
