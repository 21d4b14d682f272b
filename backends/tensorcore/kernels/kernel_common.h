// What the kernel files use, written once: TF's names, the switch of a
// variable to in-place writes, splitmix64, and the slots of an
// open-addressing table. Compiled into each of them (all inline); its text
// is in the library's cache key (`HEADERS` in __init__.py).

#ifndef RECSYS_BACKENDS_TENSORCORE_KERNELS_KERNEL_COMMON_H_
#define RECSYS_BACKENDS_TENSORCORE_KERNELS_KERNEL_COMMON_H_

#include <cstdint>
#include <cstring>

#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/resource_var.h"

namespace recsys {

using ::tensorflow::DEVICE_CPU;
using ::tensorflow::OpKernel;
using ::tensorflow::OpKernelConstruction;
using ::tensorflow::OpKernelContext;
using ::tensorflow::Tensor;
using ::tensorflow::TensorShape;
using ::tensorflow::Var;

// Switches `var` to copy-on-read mode (as TF's sparse ops, and the TF path's
// scatters, do), copying its buffer first if a dense read still aliases it:
// after this, no reader holds the buffer an op writes in place.
inline absl::Status EnsureSparseAccess(OpKernelContext* ctx, Var* var) {
  if (var->copy_on_read_mode.load()) return absl::OkStatus();
  tsl::mutex_lock lock(*var->mu());
  if (var->copy_on_read_mode.load()) return absl::OkStatus();
  if (!var->tensor()->RefCountIsOne()) {
    Tensor copy;
    TF_RETURN_IF_ERROR(ctx->allocate_temp(var->tensor()->dtype(),
                                          var->tensor()->shape(), &copy));
    std::memcpy(copy.data(), var->tensor()->data(),
                var->tensor()->TotalBytes());
    *var->tensor() = copy;
  }
  var->copy_on_read_mode.store(true);
  return absl::OkStatus();
}

// splitmix64's finalizer (index.py's `splitmix64`), in uint64 (wrapping)
// arithmetic.
inline uint64_t SplitMix64(uint64_t x) {
  uint64_t z = x + 0x9E3779B97F4A7C15ull;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

// The slots of an open-addressing table for up to `n` keys: a power of two,
// at least 16 and enough that at most `used_num / used_den` of them are used
// (default 1/2: at least 2n), indexed by the top bits of a key's 64-bit hash;
// a probe goes on to the next slot, wrapping around.
class HashSlots {
 public:
  explicit HashSlots(int64_t n, int64_t used_num = 1, int64_t used_den = 2) {
    int bits = 4;
    while ((int64_t{1} << bits) * used_num < n * used_den) ++bits;
    shift_ = 64 - bits;
    mask_ = (int64_t{1} << bits) - 1;
  }
  int64_t size() const { return mask_ + 1; }
  // The first slot a key whose hash is `hash` probes.
  int64_t First(uint64_t hash) const {
    return static_cast<int64_t>(hash >> shift_);
  }
  // The slot probed after `slot`.
  int64_t Next(int64_t slot) const { return (slot + 1) & mask_; }

 private:
  int shift_;
  int64_t mask_;
};

}  // namespace recsys

#endif  // RECSYS_BACKENDS_TENSORCORE_KERNELS_KERNEL_COMMON_H_
