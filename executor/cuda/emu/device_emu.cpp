// The emulation build of executor/cuda/device.cu.
#include "executor/cuda/device.cu"
