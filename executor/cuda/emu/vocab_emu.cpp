// The emulation build of executor/cuda/vocab.cu.
#include "executor/cuda/vocab.cu"
