// The emulation build of executor/cuda/moe.cu.
#include "executor/cuda/moe.cu"
