// The emulation build of executor/cuda/dropout.cu.
#include "executor/cuda/dropout.cu"
