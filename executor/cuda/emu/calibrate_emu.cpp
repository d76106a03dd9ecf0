// The emulation build of executor/cuda/calibrate.cu.
#include "executor/cuda/calibrate.cu"
