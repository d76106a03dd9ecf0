// The emulation build of executor/cuda/optimizer.cu.
#include "executor/cuda/optimizer.cu"
