// RecsysIdTable: the op making an IdTable resource (id_table.h), and the
// table's methods.

#include "id_table.h"

#include <algorithm>
#include <utility>

#include "tensorflow/core/framework/op.h"
#include "tensorflow/core/framework/shape_inference.h"
#include "tensorflow/core/kernels/lookup_table_op.h"

#include "kernel_common.h"

namespace recsys {

using ::tensorflow::errors::InvalidArgument;

namespace {

// Slots are at most 3/4 used: a find probes ~2.5 slots at worst, most
// within one 64-byte line (4 slots).
constexpr int64_t kMinSlots = 16;

int64_t SlotsFor(int64_t ids) {
  int64_t slots = kMinSlots;
  while (slots * 3 < ids * 4) slots *= 2;
  return slots;
}

// Finds issued ahead of the one compared: a 200,000-id table's slots (4 MB)
// mostly miss the caches.
constexpr int64_t kLookAhead = 8;

}  // namespace

IdTable::IdTable(int64_t capacity) { Reserve(std::max<int64_t>(capacity, 1)); }

int64_t IdTable::Home(int64_t key) const {
  return static_cast<int64_t>(SplitMix64(static_cast<uint64_t>(key)) >>
                              shift_);
}

int64_t IdTable::SlotOf(int64_t key) const {
  for (int64_t s = Home(key);; s = (s + 1) & mask_) {
    if (slots_[s].row < 0) return -1;
    if (slots_[s].key == key) return s;
  }
}

void IdTable::Put(int64_t key, int64_t row) {
  for (int64_t s = Home(key);; s = (s + 1) & mask_) {
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
void IdTable::Erase(int64_t slot) {
  int64_t hole = slot;
  for (int64_t s = (hole + 1) & mask_;; s = (s + 1) & mask_) {
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

void IdTable::Reserve(int64_t ids) {
  const int64_t wanted = SlotsFor(ids);
  if (wanted <= static_cast<int64_t>(slots_.size())) return;
  std::vector<Slot> old(wanted, Slot{0, -1});
  old.swap(slots_);
  int bits = 0;
  while ((int64_t{1} << bits) < wanted) ++bits;
  shift_ = 64 - bits;
  mask_ = wanted - 1;
  used_ = 0;
  for (const Slot& slot : old) {
    if (slot.row >= 0) Put(slot.key, slot.row);
  }
}

void IdTable::FindLocked(const int64_t* keys, int64_t n,
                         int64_t* rows) const {
  for (int64_t i = 0; i < n; ++i) {
    if (i + kLookAhead < n) {
      __builtin_prefetch(&slots_[Home(keys[i + kLookAhead])]);
    }
    const int64_t s = SlotOf(keys[i]);
    rows[i] = s < 0 ? -1 : slots_[s].row;
  }
}

absl::Status IdTable::InsertLocked(const int64_t* keys, const int64_t* rows,
                                   int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    if (rows[i] < 0) {
      return InvalidArgument("RecsysIdTable holds rows >= 0; got ", rows[i],
                             " for id ", keys[i]);
    }
  }
  Reserve(used_ + n);
  for (int64_t i = 0; i < n; ++i) Put(keys[i], rows[i]);
  return absl::OkStatus();
}

void IdTable::RemoveLocked(const int64_t* keys, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    const int64_t s = SlotOf(keys[i]);
    if (s >= 0) Erase(s);
  }
}

absl::Status IdTable::Find(OpKernelContext* ctx, const Tensor& keys,
                           Tensor* values, const Tensor& default_value) {
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

absl::Status IdTable::Insert(OpKernelContext* ctx, const Tensor& keys,
                             const Tensor& values) {
  (void)ctx;
  tensorflow::mutex_lock lock(mu_);
  return InsertLocked(keys.flat<int64_t>().data(),
                      values.flat<int64_t>().data(), keys.NumElements());
}

absl::Status IdTable::Remove(OpKernelContext* ctx, const Tensor& keys) {
  (void)ctx;
  tensorflow::mutex_lock lock(mu_);
  RemoveLocked(keys.flat<int64_t>().data(), keys.NumElements());
  return absl::OkStatus();
}

size_t IdTable::size() const {
  tensorflow::tf_shared_lock lock(mu_);
  return static_cast<size_t>(used_);
}

// In slot order: the same table exports the same tensors.
absl::Status IdTable::ExportValues(OpKernelContext* ctx) {
  tensorflow::tf_shared_lock lock(mu_);
  Tensor* keys = nullptr;
  Tensor* rows = nullptr;
  TF_RETURN_IF_ERROR(ctx->allocate_output("keys", TensorShape({used_}), &keys));
  TF_RETURN_IF_ERROR(
      ctx->allocate_output("values", TensorShape({used_}), &rows));
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

absl::Status IdTable::ImportValues(OpKernelContext* ctx, const Tensor& keys,
                                   const Tensor& values) {
  (void)ctx;
  tensorflow::mutex_lock lock(mu_);
  for (Slot& slot : slots_) slot.row = -1;
  used_ = 0;
  return InsertLocked(keys.flat<int64_t>().data(),
                      values.flat<int64_t>().data(), keys.NumElements());
}

int64_t IdTable::MemoryUsed() const {
  tensorflow::tf_shared_lock lock(mu_);
  return static_cast<int64_t>(sizeof(IdTable) + slots_.size() * sizeof(Slot));
}

namespace {

// The resource's maker: TF's LookupTableOp (what MutableHashTableV2 uses)
// with this table, sized by the `capacity` attr.
class SizedIdTable : public IdTable {
 public:
  SizedIdTable(OpKernelContext* ctx, OpKernel* kernel)
      : IdTable(CapacityOf(kernel)) {
    (void)ctx;
  }

 private:
  static int64_t CapacityOf(OpKernel* kernel) {
    int64_t capacity = 0;
    if (!tensorflow::GetNodeAttr(kernel->def(), "capacity", &capacity).ok()) {
      return 1;
    }
    return capacity;
  }
};

}  // namespace

REGISTER_OP("RecsysIdTable")
    .Output("table_handle: resource")
    .Attr("container: string = ''")
    .Attr("shared_name: string = ''")
    .Attr("use_node_name_sharing: bool = false")
    .Attr("key_dtype: {int64}")
    .Attr("value_dtype: {int64}")
    .Attr("capacity: int >= 0 = 0")
    .SetIsStateful()
    .SetShapeFn([](tensorflow::shape_inference::InferenceContext* c) {
      c->set_output(0, c->Scalar());
      return absl::OkStatus();
    })
    .Doc("An int64 -> int64 (row >= 0) hash table with open addressing, "
         "used by TF's lookup ops like a MutableHashTable of scalars.");

REGISTER_KERNEL_BUILDER(
    Name("RecsysIdTable").Device(DEVICE_CPU),
    tensorflow::LookupTableOp<SizedIdTable, int64_t, int64_t>);

}  // namespace recsys
