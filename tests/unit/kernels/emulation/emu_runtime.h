// A CPU emulation of CUDA thread execution, so the kernels of csrc/ can be tested without a GPU.
//
// Every CUDA thread of a block is a coroutine (ucontext) on one OS thread. The scheduler runs
// the threads round-robin; __syncthreads() and each half of a warp shuffle are yield points,
// so one round moves every live thread to its next barrier. That is a stronger barrier than
// the hardware's (it also syncs independent warps), which is harmless for convergent code.
// Blocks run one after the other. What this cannot show: memory-model races, performance.
#pragma once

#include <ucontext.h>

#include <cmath>
#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "cuda_runtime_api.h"

#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __launch_bounds__(...)
#define __shared__ static

#define MEGATRON_LAUNCH_KERNEL(kernel, grid, block, stream, ...)   \
  do {                                                             \
    (void)(stream);                                                \
    emu::launch(dim3(grid), dim3(block), [&] { kernel(__VA_ARGS__); }); \
  } while (0)

inline dim3 threadIdx, blockIdx, blockDim, gridDim;

inline int min(int a, int b) { return a < b ? a : b; }
inline float __expf(float x) { return std::exp(x); }

namespace emu {

constexpr size_t kStackBytes = 64 * 1024;

struct Thread {
  ucontext_t context;
  std::unique_ptr<char[]> stack{new char[kStackBytes]};
  dim3 index;
  unsigned int linear = 0;
  bool done = false;
};

inline ucontext_t scheduler;
inline Thread* running = nullptr;
inline const std::function<void()>* body = nullptr;
inline std::vector<float> shuffle_slots;

inline void trampoline() {
  (*body)();
  running->done = true;  // returning resumes uc_link, the scheduler
}

inline void yield() { swapcontext(&running->context, &scheduler); }

inline void run_block(std::vector<Thread>& threads) {
  for (Thread& thread : threads) {
    thread.done = false;
    getcontext(&thread.context);
    thread.context.uc_stack.ss_sp = thread.stack.get();
    thread.context.uc_stack.ss_size = kStackBytes;
    thread.context.uc_link = &scheduler;
    makecontext(&thread.context, trampoline, 0);
  }
  for (bool alive = true; alive;) {
    alive = false;
    for (Thread& thread : threads) {
      if (thread.done) continue;
      threadIdx = thread.index;
      running = &thread;
      swapcontext(&scheduler, &thread.context);
      alive = alive || !thread.done;
    }
  }
}

template <typename F>
void launch(dim3 grid, dim3 block, F&& kernel_call) {
  const std::function<void()> call = kernel_call;
  body = &call;
  std::vector<Thread> threads(block.x * block.y * block.z);
  unsigned int linear = 0;
  for (unsigned int z = 0; z < block.z; ++z)
    for (unsigned int y = 0; y < block.y; ++y)
      for (unsigned int x = 0; x < block.x; ++x) {
        threads[linear].index = dim3(x, y, z);
        threads[linear].linear = linear;
        ++linear;
      }
  shuffle_slots.assign(threads.size(), 0.f);
  blockDim = block;
  gridDim = grid;
  for (unsigned int z = 0; z < grid.z; ++z)
    for (unsigned int y = 0; y < grid.y; ++y)
      for (unsigned int x = 0; x < grid.x; ++x) {
        blockIdx = dim3(x, y, z);
        run_block(threads);
      }
}

}  // namespace emu

inline void __syncthreads() { emu::yield(); }

inline float __shfl_xor_sync(unsigned int, float value, int lane_mask) {
  const unsigned int self = emu::running->linear;
  emu::shuffle_slots[self] = value;
  emu::yield();  // every lane has written
  const float other = emu::shuffle_slots[(self & ~31u) | ((self & 31u) ^ lane_mask)];
  emu::yield();  // every lane has read before anyone writes again
  return other;
}
