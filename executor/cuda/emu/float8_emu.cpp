// The emulation build of executor/cuda/float8.cu: the same source, compiled as C++.
#include "executor/cuda/float8.cu"
