// The emulation build of executor/cuda/transfer.cu.
#include "executor/cuda/transfer.cu"
