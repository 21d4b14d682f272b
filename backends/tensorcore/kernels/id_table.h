// IdTable: the id -> row hash table of a dynamic-vocabulary index, as a TF
// lookup table (`RecsysIdTable`, id_table.cc) with open addressing.
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
// churns never slows down. The slots double when more than 3/4 are used;
// the table starts with room for its `capacity` attr (the index's rows).

#ifndef RECSYS_BACKENDS_TENSORCORE_KERNELS_ID_TABLE_H_
#define RECSYS_BACKENDS_TENSORCORE_KERNELS_ID_TABLE_H_

#include <cstdint>
#include <vector>

#include "tensorflow/core/framework/lookup_interface.h"
#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/platform/mutex.h"

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

  int64_t Home(int64_t key) const;
  int64_t SlotOf(int64_t key) const;  // its slot, or -1
  void Put(int64_t key, int64_t row);
  void Erase(int64_t slot);
  void Reserve(int64_t ids);  // room for `ids` keys within the load limit

  mutable tensorflow::mutex mu_;
  std::vector<Slot> slots_;
  int shift_ = 64;
  int64_t mask_ = 0;
  int64_t used_ = 0;
};

}  // namespace recsys

#endif  // RECSYS_BACKENDS_TENSORCORE_KERNELS_ID_TABLE_H_
