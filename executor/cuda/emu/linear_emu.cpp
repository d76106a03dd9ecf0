// The emulation build of executor/cuda/linear.cu.
#include "executor/cuda/linear.cu"
