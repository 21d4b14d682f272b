// IdTable: the id -> row hash table of a dynamic-vocabulary index, as a TF
// lookup table with open addressing (all inline: the op that makes it,
// `RecsysIdTable`, and the update that reads it straight are in
// vocabulary_ops.cc, one compile).
//
// TF's MutableHashTable of int64 scalars is a std::unordered_map: a find
// walks a bucket's chain of nodes, two dependent cache misses per id, and
// the fused update (vocabulary_ops.cc) spent more time in it than in all
// its own steps. This table keeps (key, row) pairs in one array of 16-byte
// slots, linear probing from splitmix64's top bits: a find is one cache
// line, issued ahead by the fused op's loop. It is a whole TF lookup table
// (Find, Insert, Remove, Export, Import), so TF's own lookup ops and
// checkpoints (`-keys`, `-values`, as MutableHashTable's) work on it
// unchanged, and a checkpoint of either table restores into the other.
//
// Values are rows: >= 0 (an empty slot holds -1; no key is reserved).
// Removal shifts the probe run back (no tombstones), so a table that
// churns never slows down. The slots double when more than 4/5 are used;
// the table starts with room for its `capacity` attr (the index's rows).

#ifndef RECSYS_BACKENDS_TENSORCORE_KERNELS_ID_TABLE_H_
#define RECSYS_BACKENDS_TENSORCORE_KERNELS_ID_TABLE_H_

#include <algorithm>
#include <cstdint>
#include <vector>

#include "tensorflow/core/framework/lookup_interface.h"
#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/platform/mutex.h"

#include "kernel_common.h"

namespace recsys {

class IdTable : public tensorflow::lookup::LookupInterface {
 public:
  // `capacity`: the ids the table is sized for at first (it grows past).
  explicit IdTable(int64_t capacity);

  // -- the fused update's calls: the caller holds mu() exclusively --------
  tensorflow::mutex* mu() { return &mu_; }
  // rows[i] = the row of keys[i], or -1 (the next finds' slots fetched
  // ahead while this one is compared).
  void FindLocked(const int64_t* keys, int64_t n, int64_t* rows) const;
  // Inserts (or overwrites) each key's row; rows must be >= 0.
  absl::Status InsertLocked(const int64_t* keys, const int64_t* rows,
                            int64_t n);
  void RemoveLocked(const int64_t* keys, int64_t n);

  // -- LookupInterface ------------------------------------------------------
  absl::Status Find(tensorflow::OpKernelContext* ctx,
                    const tensorflow::Tensor& keys, tensorflow::Tensor* values,
                    const tensorflow::Tensor& default_value) override;
  absl::Status Insert(tensorflow::OpKernelContext* ctx,
                      const tensorflow::Tensor& keys,
                      const tensorflow::Tensor& values) override;
  absl::Status Remove(tensorflow::OpKernelContext* ctx,
                      const tensorflow::Tensor& keys) override;
  size_t size() const override;
  absl::Status ExportValues(tensorflow::OpKernelContext* ctx) override;
  absl::Status ImportValues(tensorflow::OpKernelContext* ctx,
                            const tensorflow::Tensor& keys,
                            const tensorflow::Tensor& values) override;
  tensorflow::DataType key_dtype() const override {
    return tensorflow::DT_INT64;
  }
  tensorflow::DataType value_dtype() const override {
    return tensorflow::DT_INT64;
  }
  tensorflow::TensorShape key_shape() const override {
    return tensorflow::TensorShape();
  }
  tensorflow::TensorShape value_shape() const override {
    return tensorflow::TensorShape();
  }
  int64_t MemoryUsed() const override;

 private:
  struct Slot {
    int64_t key;
    int64_t row;  // -1: empty
  };

  // The slot a key probes first; the key's slot, or -1 (inline: the
  // finds' loop).
  int64_t Home(int64_t key) const {
    return shape_.First(SplitMix64(static_cast<uint64_t>(key)));
  }
  int64_t SlotOf(int64_t key) const {
    for (int64_t s = Home(key);; s = shape_.Next(s)) {
      if (slots_[s].row < 0) return -1;
      if (slots_[s].key == key) return s;
    }
  }
  void Put(int64_t key, int64_t row);
  void Erase(int64_t slot);
  void Reserve(int64_t ids);  // room for `ids` keys within the load limit

  mutable tensorflow::mutex mu_;
  std::vector<Slot> slots_;
  HashSlots shape_{0};  // slots_'s size and probe order
  int64_t used_ = 0;
};

namespace id_table_internal {

// Slots are at most 4/5 used: a find of a key probes ~3 slots at worst
// (a key not there ~13), 4 to a 64-byte line; a 200,000-row index takes
// 2^18 slots, 4 MB.
constexpr int64_t kUsedNum = 4, kUsedDen = 5;

// Finds issued ahead of the one compared: the slots mostly miss the caches
// but for the frequent ids'.
constexpr int64_t kLookAhead = 32;

}  // namespace id_table_internal

inline IdTable::IdTable(int64_t capacity) {
  Reserve(std::max<int64_t>(capacity, 1));
}

inline void IdTable::Put(int64_t key, int64_t row) {
  for (int64_t s = Home(key);; s = shape_.Next(s)) {
    if (slots_[s].row < 0) {
      slots_[s] = {key, row};
      ++used_;
      return;
    }
    if (slots_[s].key == key) {
      slots_[s].row = row;
      return;
    }
  }
}

// Backward-shift deletion: each later slot of the probe run whose home is
// not cyclically in (hole, slot] moves into the hole, so every key stays
// reachable from its home without tombstones.
inline void IdTable::Erase(int64_t slot) {
  int64_t hole = slot;
  for (int64_t s = shape_.Next(hole);; s = shape_.Next(s)) {
    if (slots_[s].row < 0) break;
    const int64_t home = Home(slots_[s].key);
    const bool stays = hole <= s ? (hole < home && home <= s)
                                 : (hole < home || home <= s);
    if (!stays) {
      slots_[hole] = slots_[s];
      hole = s;
    }
  }
  slots_[hole].row = -1;
  --used_;
}

inline void IdTable::Reserve(int64_t ids) {
  const HashSlots wanted(ids, id_table_internal::kUsedNum,
                         id_table_internal::kUsedDen);
  if (wanted.size() <= static_cast<int64_t>(slots_.size())) return;
  std::vector<Slot> old(wanted.size(), Slot{0, -1});
  old.swap(slots_);
  shape_ = wanted;
  used_ = 0;
  for (const Slot& slot : old) {
    if (slot.row >= 0) Put(slot.key, slot.row);
  }
}

inline void IdTable::FindLocked(const int64_t* keys, int64_t n,
                         int64_t* rows) const {
  for (int64_t i = 0; i < n; ++i) {
    if (i + id_table_internal::kLookAhead < n) {
      __builtin_prefetch(&slots_[Home(keys[i + id_table_internal::kLookAhead])]);
    }
    const int64_t s = SlotOf(keys[i]);
    rows[i] = s < 0 ? -1 : slots_[s].row;
  }
}

inline absl::Status IdTable::InsertLocked(const int64_t* keys, const int64_t* rows,
                                   int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    if (rows[i] < 0) {
      return tensorflow::errors::InvalidArgument("RecsysIdTable holds rows >= 0; got ", rows[i],
                             " for id ", keys[i]);
    }
  }
  Reserve(used_ + n);
  for (int64_t i = 0; i < n; ++i) Put(keys[i], rows[i]);
  return absl::OkStatus();
}

inline void IdTable::RemoveLocked(const int64_t* keys, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    const int64_t s = SlotOf(keys[i]);
    if (s >= 0) Erase(s);
  }
}

inline absl::Status IdTable::Find(tensorflow::OpKernelContext* ctx, const tensorflow::Tensor& keys,
                           tensorflow::Tensor* values, const tensorflow::Tensor& default_value) {
  (void)ctx;
  // One default, or one per key (TF's dynamic_default_values).
  const auto defaults = default_value.flat<int64_t>();
  const bool one = defaults.size() == 1;
  const int64_t n = keys.NumElements();
  int64_t* out = values->flat<int64_t>().data();
  {
    tensorflow::tf_shared_lock lock(mu_);
    FindLocked(keys.flat<int64_t>().data(), n, out);
  }
  for (int64_t i = 0; i < n; ++i) {
    if (out[i] < 0) out[i] = one ? defaults(0) : defaults(i);
  }
  return absl::OkStatus();
}

inline absl::Status IdTable::Insert(tensorflow::OpKernelContext* ctx, const tensorflow::Tensor& keys,
                             const tensorflow::Tensor& values) {
  (void)ctx;
  tensorflow::mutex_lock lock(mu_);
  return InsertLocked(keys.flat<int64_t>().data(),
                      values.flat<int64_t>().data(), keys.NumElements());
}

inline absl::Status IdTable::Remove(tensorflow::OpKernelContext* ctx, const tensorflow::Tensor& keys) {
  (void)ctx;
  tensorflow::mutex_lock lock(mu_);
  RemoveLocked(keys.flat<int64_t>().data(), keys.NumElements());
  return absl::OkStatus();
}

inline size_t IdTable::size() const {
  tensorflow::tf_shared_lock lock(mu_);
  return static_cast<size_t>(used_);
}

// In slot order: the same table exports the same tensors.
inline absl::Status IdTable::ExportValues(tensorflow::OpKernelContext* ctx) {
  tensorflow::tf_shared_lock lock(mu_);
  tensorflow::Tensor* keys = nullptr;
  tensorflow::Tensor* rows = nullptr;
  TF_RETURN_IF_ERROR(ctx->allocate_output("keys", tensorflow::TensorShape({used_}), &keys));
  TF_RETURN_IF_ERROR(
      ctx->allocate_output("values", tensorflow::TensorShape({used_}), &rows));
  int64_t* k = keys->flat<int64_t>().data();
  int64_t* r = rows->flat<int64_t>().data();
  int64_t at = 0;
  for (const Slot& slot : slots_) {
    if (slot.row < 0) continue;
    k[at] = slot.key;
    r[at] = slot.row;
    ++at;
  }
  return absl::OkStatus();
}

inline absl::Status IdTable::ImportValues(tensorflow::OpKernelContext* ctx, const tensorflow::Tensor& keys,
                                   const tensorflow::Tensor& values) {
  (void)ctx;
  tensorflow::mutex_lock lock(mu_);
  for (Slot& slot : slots_) slot.row = -1;
  used_ = 0;
  return InsertLocked(keys.flat<int64_t>().data(),
                      values.flat<int64_t>().data(), keys.NumElements());
}

inline int64_t IdTable::MemoryUsed() const {
  tensorflow::tf_shared_lock lock(mu_);
  return static_cast<int64_t>(sizeof(IdTable) + slots_.size() * sizeof(Slot));
}

}  // namespace recsys

#endif  // RECSYS_BACKENDS_TENSORCORE_KERNELS_ID_TABLE_H_
