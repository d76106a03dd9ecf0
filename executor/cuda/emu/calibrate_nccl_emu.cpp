// The emulation build of executor/cuda/calibrate_nccl.cu, over the NCCL emulation.
#include "executor/cuda/calibrate_nccl.cu"
