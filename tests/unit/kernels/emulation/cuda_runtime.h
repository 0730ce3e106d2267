// CPU emulation of <cuda_runtime.h> for the kernel tests: see emu_runtime.h.
#pragma once

#include "cuda_runtime_api.h"
#include "emu_runtime.h"
