// simt/include/cuda_runtime.h — the SIMT emulation build's <cuda_runtime.h>
// (simt/simt.h).
#pragma once
#include "../simt.h"
