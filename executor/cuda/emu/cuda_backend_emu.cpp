// The emulation build of executor/cuda/cuda_backend.cu.
#include "executor/cuda/cuda_backend.cu"
