// The emulation build of executor/cuda/pointwise.cu: the same source, compiled as C++.
#include "executor/cuda/pointwise.cu"
