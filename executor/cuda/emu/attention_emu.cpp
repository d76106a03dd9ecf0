// The emulation build of executor/cuda/attention.cu.
#include "executor/cuda/attention.cu"
