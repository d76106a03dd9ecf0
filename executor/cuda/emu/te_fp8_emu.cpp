// The emulation build of executor/cuda/te_fp8.cu: the same source, compiled as C++.
#include "executor/cuda/te_fp8.cu"
