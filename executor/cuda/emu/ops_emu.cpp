// The emulation build of executor/cuda/ops.cu.
#include "executor/cuda/ops.cu"
