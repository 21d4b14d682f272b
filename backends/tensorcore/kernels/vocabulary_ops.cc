// RecsysVocabularyUpdate: `VocabularyIndex.update` (backends/vocabulary/
// index.py) as one CPU op, on the same state as its TF ops.
//
// The TF-ops update of one table is ~60 ops (a unique, hash-table finds,
// boolean masks, scatters, the sketch's hashes in uint64 ops, a masked top_k
// over every row when rows run out), each a pass with its own scheduling:
// ~0.5 ms a table on a step with free rows, ~2 ms when it evicts. This op
// does the same in one pass over the batch's ids (each looked up in the
// id table, the few without a row then de-duplicated), and when rows run
// out one pass over the rows that keeps the few victims it needs (a bounded
// heap) instead of top_k's selection over all of them. The batch comes in
// pieces as the stage has them (flat ids, or padded bags [B, W] with their
// lengths), and each piece's rows go out in its shape: no flattening,
// concat or split ops around it.
//
// Same state: the op takes the index's own resources, its id table (the
// kernels' RecsysIdTable, id_table.h, straight on its slots; or a TF
// `MutableHashTable` through `lookup::LookupInterface`: its Find, Insert
// and Remove, batched as the TF ops call them) and its variables (keys,
// occupied, counts, last_seen, sketch_cells, the counters, and the free
// list with eviction "age"), and changes them in place. Nothing else is
// kept between calls but scratch space, so a step may run either path and
// a checkpoint of either is the other's.
//
// Same results, by construction: the steps of index.py's module docstring in
// the same order (known ids counted, the "age" sweep, the sketch, the
// candidates, free rows then victims), the same splitmix64 hashes in uint64
// arithmetic, int64 sums wrapping as TF's do, the same free list rebuilt
// after a sweep, and the victims top_k would choose: top_k of
// `eligible ? ~score : INT64_MIN` takes the largest values first and, among
// equal ones, the lower row; the heap keeps exactly those.
//
// Variables are accessed as embedding_ops.cc does (and as the TF path's
// scatters leave them): copy-on-read mode, then every variable's lock held
// exclusively for the whole update (taken in address order, as TF's own
// multi-variable ops do). The hash table locks itself on each call.

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <limits>
#include <queue>
#include <string>
#include <utility>
#include <vector>

#include "tensorflow/core/framework/lookup_interface.h"
#include "tensorflow/core/framework/op.h"
#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/resource_mgr.h"
#include "tensorflow/core/framework/resource_var.h"
#include "tensorflow/core/framework/shape_inference.h"
#include "tensorflow/core/kernels/lookup_table_op.h"

#include "id_table.h"
#include "kernel_common.h"

namespace recsys {
namespace {

using ::tensorflow::errors::FailedPrecondition;
using ::tensorflow::errors::InvalidArgument;
using ::tensorflow::lookup::LookupInterface;
using ::tensorflow::shape_inference::InferenceContext;

constexpr int64_t kInt64Min = std::numeric_limits<int64_t>::min();
// `lucky` is 53 bits: an admit_below of 2^53 admits every candidate.
constexpr int64_t kAlwaysLucky = int64_t{1} << 53;

// Accesses issued ahead in the loops over random rows and sketch cells (the
// state of a 200,000-row table, its 2 x 2^20-cell sketch, is 20 MB: most
// of them miss the caches).
constexpr int64_t kLookAhead = 16;

// Rows scanned at a time by the victims' and the sweep's passes over every
// row: a block is first summarized in a loop the compiler vectorizes, and
// read row by row only when it may hold something.
constexpr int64_t kBlock = 256;

// int64 a + b and a - b wrapping, as TF's int64 ops compute them.
inline int64_t Add(int64_t a, int64_t b) {
  return static_cast<int64_t>(static_cast<uint64_t>(a) +
                              static_cast<uint64_t>(b));
}
inline int64_t Sub(int64_t a, int64_t b) {
  return static_cast<int64_t>(static_cast<uint64_t>(a) -
                              static_cast<uint64_t>(b));
}

// Numbers the distinct ids of a batch in first-occurrence order (as
// tf.unique_with_counts): open addressing over any int64 (no key is
// reserved), slots by splitmix64. The op keeps one and reuses it: its
// slots (2n, 16 bytes each: 300 KB for a 9,200-id batch) would otherwise be
// a fresh mmap, page faults and all, at every call; a slot is empty when
// its stamp is not the call's, so a call clears nothing.
class FirstOccurrence {
 public:
  // Starts a batch of up to `n` ids.
  void Start(int64_t n) {
    HashSlots wanted(n);
    if (wanted.size() > static_cast<int64_t>(entries_.size())) {
      slots_ = wanted;
      entries_.assign(wanted.size(), Entry{0, 0, 0});
      stamp_ = 0;
    }
    if (++stamp_ == 0) {  // 2^32 calls: clear once, start over
      for (Entry& e : entries_) e.stamp = 0;
      stamp_ = 1;
    }
  }

  // The slot `id` probes first (for a prefetch).
  const void* Home(int64_t id) const {
    return &entries_[slots_.First(SplitMix64(static_cast<uint64_t>(id)))];
  }

  // The number of `id`: `next` if it is new (*added true).
  int64_t Insert(int64_t id, int64_t next, bool* added) {
    int64_t slot = slots_.First(SplitMix64(static_cast<uint64_t>(id)));
    while (true) {
      Entry& e = entries_[slot];
      if (e.stamp != stamp_) {
        e = Entry{id, static_cast<int32_t>(next), stamp_};
        *added = true;
        return next;
      }
      if (e.key == id) {
        *added = false;
        return e.number;
      }
      slot = slots_.Next(slot);
    }
  }

 private:
  struct Entry {
    int64_t key;
    int32_t number;  // < n < 2^31 (the op checks)
    uint32_t stamp;
  };

  HashSlots slots_{0};
  std::vector<Entry> entries_;
  uint32_t stamp_ = 0;
};

// The index's state: its variables' buffers, written in place.
struct State {
  int64_t rows = 0;   // R, the rows ids may take
  int64_t width = 0;  // W, the sketch's columns per hash row
  int64_t* keys = nullptr;
  bool* occupied = nullptr;
  int64_t* counts = nullptr;
  int64_t* last_seen = nullptr;
  int64_t* sketch = nullptr;  // [2 * W]
  int64_t* rows_in_use = nullptr;
  int64_t* admissions = nullptr;
  int64_t* evictions = nullptr;
  int64_t* refused = nullptr;
  int64_t* default_hits = nullptr;
  int64_t* free_rows = nullptr;  // eviction "age" only
  int64_t* free_head = nullptr;
};

enum class Eviction { kNone, kLru, kLfu, kAge };

// The hash table's batched calls: on an IdTable (RecsysIdTable, the
// index's own) straight on its slots, under its lock held for the whole
// update; on another lookup table (a MutableHashTable) through its
// interface, on int64 tensors.
class Table {
 public:
  Table(OpKernelContext* ctx, LookupInterface* table)
      : ctx_(ctx), table_(table), ids_(dynamic_cast<IdTable*>(table)) {
    if (ids_ != nullptr) ids_->mu()->lock();
  }
  ~Table() {
    if (ids_ != nullptr) ids_->mu()->unlock();
  }
  Table(const Table&) = delete;
  Table& operator=(const Table&) = delete;

  absl::Status Check() const {
    if (table_->key_dtype() != tensorflow::DT_INT64 ||
        table_->value_dtype() != tensorflow::DT_INT64 ||
        table_->value_shape().dims() != 0) {
      return InvalidArgument(
          "table must be a RecsysIdTable or MutableHashTable of int64 keys to "
          "int64 values; "
          "got ", tensorflow::DataTypeString(table_->key_dtype()), " -> ",
          tensorflow::DataTypeString(table_->value_dtype()), " ",
          table_->value_shape().DebugString());
    }
    return absl::OkStatus();
  }

  // rows[i] = the row of keys[i], or -1.
  absl::Status Find(const std::vector<int64_t>& keys,
                    std::vector<int64_t>* rows) {
    if (ids_ != nullptr) {
      rows->resize(keys.size());
      ids_->FindLocked(keys.data(), static_cast<int64_t>(keys.size()),
                       rows->data());
      return absl::OkStatus();
    }
    Tensor keys_t, rows_t, minus_one;
    TF_RETURN_IF_ERROR(Vector(keys, &keys_t));
    TF_RETURN_IF_ERROR(ctx_->allocate_temp(
        tensorflow::DT_INT64, keys_t.shape(), &rows_t));
    TF_RETURN_IF_ERROR(
        ctx_->allocate_temp(tensorflow::DT_INT64, TensorShape({}), &minus_one));
    minus_one.scalar<int64_t>()() = -1;
    TF_RETURN_IF_ERROR(table_->Find(ctx_, keys_t, &rows_t, minus_one));
    const int64_t* found = rows_t.flat<int64_t>().data();
    rows->assign(found, found + keys.size());
    return absl::OkStatus();
  }

  absl::Status Remove(const std::vector<int64_t>& keys) {
    if (keys.empty()) return absl::OkStatus();
    if (ids_ != nullptr) {
      ids_->RemoveLocked(keys.data(), static_cast<int64_t>(keys.size()));
      return absl::OkStatus();
    }
    Tensor keys_t;
    TF_RETURN_IF_ERROR(Vector(keys, &keys_t));
    return table_->Remove(ctx_, keys_t);
  }

  absl::Status Insert(const std::vector<int64_t>& keys,
                      const std::vector<int64_t>& rows) {
    if (keys.empty()) return absl::OkStatus();
    if (ids_ != nullptr) {
      return ids_->InsertLocked(keys.data(), rows.data(),
                                static_cast<int64_t>(keys.size()));
    }
    Tensor keys_t, rows_t;
    TF_RETURN_IF_ERROR(Vector(keys, &keys_t));
    TF_RETURN_IF_ERROR(Vector(rows, &rows_t));
    return table_->Insert(ctx_, keys_t, rows_t);
  }

 private:
  absl::Status Vector(const std::vector<int64_t>& values, Tensor* out) {
    TF_RETURN_IF_ERROR(ctx_->allocate_temp(
        tensorflow::DT_INT64,
        TensorShape({static_cast<int64_t>(values.size())}), out));
    std::copy(values.begin(), values.end(), out->flat<int64_t>().data());
    return absl::OkStatus();
  }

  OpKernelContext* ctx_;
  LookupInterface* table_;
  IdTable* ids_;
};

// A victim candidate: top_k's value of a row and the row.
struct Scored {
  int64_t score;
  int64_t row;
};

// Up to `wanted` rows that `top_k(eligible ? ~score : INT64_MIN, k)` takes,
// k = min(wanted, eligible rows), in its order (value descending, then row
// ascending): one pass over the rows keeping the best `wanted` in a heap
// whose top is the worst kept. Rows come in ascending order, so a row
// displaces the worst only with a strictly larger value (an equal value's
// lower row, kept, comes first in top_k). Most rows are one comparison.
//
// Blocks of kBlock rows: a vectorized pass gives a block's eligible rows
// and whether any row beats the worst kept; once the heap is full, a block
// where none does is skipped (most of them: the heap soon holds the oldest
// rows).
std::vector<int64_t> Victims(const State& s, Eviction eviction, int64_t step,
                             int64_t wanted) {
  const int64_t* __restrict by =
      eviction == Eviction::kLfu ? s.counts : s.last_seen;
  // bool as its byte: GCC vectorizes the loops below over uint8 loads.
  const uint8_t* __restrict occupied =
      reinterpret_cast<const uint8_t*>(s.occupied);
  const int64_t* __restrict last_seen = s.last_seen;
  const int64_t rows = s.rows;
  const size_t keep = static_cast<size_t>(std::min(wanted, rows));
  auto worse = [](const Scored& a, const Scored& b) {
    // a before b in top_k's order: the heap's top is the last kept.
    return a.score > b.score || (a.score == b.score && a.row < b.row);
  };
  std::vector<Scored> heap;
  heap.reserve(keep);
  int64_t eligible_rows = 0;
  int64_t scores[kBlock];
  for (int64_t begin = 0; begin < rows; begin += kBlock) {
    const int64_t size = std::min(kBlock, rows - begin);
    // Whether a row beats the worst kept (any row, until the heap is full).
    const int64_t threshold =
        heap.size() == keep ? heap.front().score : kInt64Min;
    const bool full = heap.size() == keep;
    int64_t eligible_here = 0, beats = 0;
    for (int64_t i = 0; i < size; ++i) {
      const int64_t r = begin + i;
      const int64_t eligible = static_cast<int64_t>(occupied[r]) &
                               static_cast<int64_t>(last_seen[r] != step);
      const int64_t score = eligible ? ~by[r] : kInt64Min;
      scores[i] = score;
      eligible_here += eligible;
      beats |= static_cast<int64_t>(score > threshold);
    }
    eligible_rows += eligible_here;
    if (full && !beats) continue;
    for (int64_t i = 0; i < size; ++i) {
      const int64_t score = scores[i];
      if (heap.size() < keep) {
        heap.push_back({score, begin + i});
        std::push_heap(heap.begin(), heap.end(), worse);
      } else if (score > heap.front().score) {
        std::pop_heap(heap.begin(), heap.end(), worse);
        heap.back() = {score, begin + i};
        std::push_heap(heap.begin(), heap.end(), worse);
      }
    }
  }
  std::sort_heap(heap.begin(), heap.end(), worse);
  const int64_t k = std::min(wanted, eligible_rows);
  std::vector<int64_t> victims;
  victims.reserve(k);
  for (int64_t i = 0; i < k; ++i) victims.push_back(heap[i].row);
  return victims;
}

class VocabularyUpdateOp : public OpKernel {
 public:
  explicit VocabularyUpdateOp(OpKernelConstruction* ctx) : OpKernel(ctx) {
    std::string eviction;
    OP_REQUIRES_OK(ctx, ctx->GetAttr("eviction", &eviction));
    eviction_ = eviction == "none"  ? Eviction::kNone
                : eviction == "lru" ? Eviction::kLru
                : eviction == "lfu" ? Eviction::kLfu
                                    : Eviction::kAge;
    OP_REQUIRES_OK(ctx, ctx->GetAttr("admit_after", &admit_after_));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("admit_below", &admit_below_));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("max_age", &max_age_));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("evict_every", &evict_every_));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("padded", &padded_));
    int64_t salt = 0;
    OP_REQUIRES_OK(ctx, ctx->GetAttr("sketch_salt_0", &salt));
    sketch_salts_[0] = static_cast<uint64_t>(salt);
    OP_REQUIRES_OK(ctx, ctx->GetAttr("sketch_salt_1", &salt));
    sketch_salts_[1] = static_cast<uint64_t>(salt);
    OP_REQUIRES_OK(ctx, ctx->GetAttr("admit_salt", &salt));
    admit_salt_ = static_cast<uint64_t>(salt);
    int num_free = 0;
    OP_REQUIRES_OK(ctx, ctx->GetAttr("num_free", &num_free));
    OP_REQUIRES(ctx, (num_free == 2) == (eviction_ == Eviction::kAge),
                InvalidArgument("eviction ", eviction, " takes ",
                                eviction_ == Eviction::kAge ? 2 : 0,
                                " free-list variables; got ", num_free));
    OP_REQUIRES(ctx, evict_every_ >= 1,
                InvalidArgument("evict_every must be >= 1; got ",
                                evict_every_));
  }

  void Compute(OpKernelContext* ctx) override {
    tsl::core::RefCountPtr<LookupInterface> lookup;
    OP_REQUIRES_OK(ctx, tensorflow::LookupResource(
                            ctx, tensorflow::HandleFromInput(ctx, 0), &lookup));
    Table table(ctx, lookup.get());
    OP_REQUIRES_OK(ctx, table.Check());

    // Inputs 1..12: keys, occupied, counts, last_seen, sketch_cells, the
    // five counters, then free_rows and free_head with eviction "age".
    const int num_vars = eviction_ == Eviction::kAge ? 12 : 10;
    std::vector<tsl::core::RefCountPtr<Var>> vars(num_vars);
    for (int i = 0; i < num_vars; ++i) {
      OP_REQUIRES_OK(ctx, tensorflow::LookupResource(
                              ctx, tensorflow::HandleFromInput(ctx, 1 + i),
                              &vars[i]));
      OP_REQUIRES_OK(ctx, EnsureSparseAccess(ctx, vars[i].get()));
    }
    // The batch: pieces of ids, each flat (every element an id) or padded
    // bags ([B, W], the first lengths[b] of row b are ids), in order.
    tensorflow::OpInputList pieces, lengths;
    OP_REQUIRES_OK(ctx, ctx->input_list("ids", &pieces));
    OP_REQUIRES_OK(ctx, ctx->input_list("lengths", &lengths));
    const Tensor& step_t = ctx->input(ctx->num_inputs() - 1);
    OP_REQUIRES(ctx, step_t.dims() == 0,
                InvalidArgument("step must be a scalar; got ",
                                step_t.shape().DebugString()));
    OP_REQUIRES(ctx, static_cast<int>(padded_.size()) == pieces.size(),
                InvalidArgument("padded has ", padded_.size(),
                                " entries for ", pieces.size(), " pieces"));
    for (int p = 0; p < pieces.size(); ++p) {
      if (!padded_[p]) continue;
      const Tensor& ids = pieces[p];
      const Tensor& bag_lengths = lengths[p];
      OP_REQUIRES(ctx, ids.dims() == 2 && bag_lengths.dims() == 1 &&
                           bag_lengths.dim_size(0) == ids.dim_size(0),
                  InvalidArgument("padded piece ", p, ": ids must be [B, W] "
                                  "and lengths [B]; got ",
                                  ids.shape().DebugString(), " and ",
                                  bag_lengths.shape().DebugString()));
      const auto l = bag_lengths.flat<int64_t>();
      for (int64_t b = 0; b < l.size(); ++b) {
        OP_REQUIRES(ctx, l(b) >= 0,
                    InvalidArgument("padded piece ", p, ": bag ", b,
                                    " has length ", l(b)));
      }
    }

    std::vector<Var*> order;
    for (auto& v : vars) order.push_back(v.get());
    std::sort(order.begin(), order.end());
    order.erase(std::unique(order.begin(), order.end()), order.end());
    for (Var* v : order) v->mu()->lock();
    State state;
    absl::Status status = Bind(vars, &state);
    tensorflow::mutex_lock scratch(scratch_mu_);
    if (status.ok()) {
      Gather(pieces, lengths);
      status = Update(ctx, &table, state, step_t.scalar<int64_t>()());
    }
    for (auto it = order.rbegin(); it != order.rend(); ++it) {
      (*it)->mu()->unlock();
    }
    OP_REQUIRES_OK(ctx, status);
    OP_REQUIRES_OK(ctx, Scatter(ctx, pieces, lengths));
  }

 private:
  // The batch's ids, piece by piece (a padded piece's real entries,
  // row-major), into ids_.
  void Gather(const tensorflow::OpInputList& pieces,
              const tensorflow::OpInputList& lengths) const {
    ids_.clear();
    for (int p = 0; p < pieces.size(); ++p) {
      const int64_t* values = pieces[p].flat<int64_t>().data();
      if (!padded_[p]) {
        ids_.insert(ids_.end(), values, values + pieces[p].NumElements());
        continue;
      }
      const int64_t width = pieces[p].dim_size(1);
      const auto l = lengths[p].flat<int64_t>();
      for (int64_t b = 0; b < l.size(); ++b) {
        const int64_t* row = values + b * width;
        ids_.insert(ids_.end(), row, row + std::min(l(b), width));
      }
    }
  }

  // Output p: piece p's rows in its shape (0 past a padded bag's length).
  absl::Status Scatter(OpKernelContext* ctx,
                       const tensorflow::OpInputList& pieces,
                       const tensorflow::OpInputList& lengths) const {
    tensorflow::OpOutputList outputs;
    TF_RETURN_IF_ERROR(ctx->output_list("rows", &outputs));
    const int64_t* rows = rows_.data();
    for (int p = 0; p < pieces.size(); ++p) {
      Tensor* out = nullptr;
      TF_RETURN_IF_ERROR(outputs.allocate(p, pieces[p].shape(), &out));
      int64_t* o = out->flat<int64_t>().data();
      if (!padded_[p]) {
        const int64_t n = pieces[p].NumElements();
        std::copy(rows, rows + n, o);
        rows += n;
        continue;
      }
      const int64_t width = pieces[p].dim_size(1);
      const auto l = lengths[p].flat<int64_t>();
      for (int64_t b = 0; b < l.size(); ++b) {
        const int64_t real = std::min(l(b), width);
        std::copy(rows, rows + real, o + b * width);
        std::fill(o + b * width + real, o + (b + 1) * width, 0);
        rows += real;
      }
    }
    return absl::OkStatus();
  }

  // The variables' buffers, their dtypes and shapes checked.
  absl::Status Bind(const std::vector<tsl::core::RefCountPtr<Var>>& vars,
                    State* s) const {
    static const char* const kNames[] = {
        "keys",      "occupied",   "counts",    "last_seen",
        "sketch_cells", "rows_in_use", "admissions", "evictions",
        "refused",   "default_hits", "free_rows", "free_head"};
    for (size_t i = 0; i < vars.size(); ++i) {
      if (!vars[i]->is_initialized) {
        return FailedPrecondition("the index's variable ", kNames[i],
                                  " is not initialized");
      }
      const Tensor& t = *vars[i]->tensor();
      const bool vector = i < 5 || i == 10;
      const auto dtype = i == 1 ? tensorflow::DT_BOOL : tensorflow::DT_INT64;
      if (t.dtype() != dtype || t.dims() != (vector ? 1 : 0)) {
        return InvalidArgument(
            "the index's variable ", kNames[i], " must be ",
            vector ? "a vector" : "a scalar", " of ",
            tensorflow::DataTypeString(dtype), "; got ",
            tensorflow::DataTypeString(t.dtype()), " ",
            t.shape().DebugString());
      }
    }
    auto data = [&vars](int i) {
      return static_cast<int64_t*>(vars[i]->tensor()->data());
    };
    s->rows = vars[0]->tensor()->NumElements();
    const int64_t cells = vars[4]->tensor()->NumElements();
    s->width = cells / 2;
    for (int i : {1, 2, 3}) {
      if (vars[i]->tensor()->NumElements() != s->rows) {
        return InvalidArgument("the index's variable ", kNames[i], " has ",
                               vars[i]->tensor()->NumElements(),
                               " rows; keys has ", s->rows);
      }
    }
    if (cells < 2 || cells % 2 != 0) {
      return InvalidArgument("sketch_cells must hold 2 rows of >= 1 columns;"
                             " got ", cells, " cells");
    }
    s->keys = data(0);
    s->occupied = static_cast<bool*>(vars[1]->tensor()->data());
    s->counts = data(2);
    s->last_seen = data(3);
    s->sketch = data(4);
    s->rows_in_use = data(5);
    s->admissions = data(6);
    s->evictions = data(7);
    s->refused = data(8);
    s->default_hits = data(9);
    if (vars.size() == 12) {
      if (vars[10]->tensor()->NumElements() != s->rows) {
        return InvalidArgument("free_rows has ",
                               vars[10]->tensor()->NumElements(),
                               " rows; keys has ", s->rows);
      }
      s->free_rows = data(10);
      s->free_head = data(11);
    }
    if (*s->rows_in_use < 0 || *s->rows_in_use > s->rows) {
      return InvalidArgument("rows_in_use is ", *s->rows_in_use,
                             ", outside [0, ", s->rows, "]");
    }
    return absl::OkStatus();
  }

  // A row the hash table gave, checked against the rows (as the TF path's
  // scatters check their indices).
  static absl::Status CheckRow(int64_t row, int64_t rows) {
    if (row < -1 || row >= rows) {
      return InvalidArgument("the hash table maps an id to row ", row,
                             ", outside [0, ", rows, ")");
    }
    return absl::OkStatus();
  }

  // Eviction "age": frees the rows not seen for more than max_age steps
  // (index.py `_sweep`), when the step is a multiple of evict_every.
  absl::Status Sweep(Table* table, const State& s, int64_t step) const {
    int64_t due = step % evict_every_;  // floor modulo, as tf.math.floormod
    if (due < 0) due += evict_every_;
    if (due != 0) return absl::OkStatus();
    std::vector<int64_t> freed_keys;
    const int64_t* __restrict last_seen = s.last_seen;
    uint8_t* __restrict occupied = reinterpret_cast<uint8_t*>(s.occupied);
    const int64_t max_age = max_age_;
    // occupied, last_seen != step and step - last_seen > max_age (wrapping):
    // a block without such a row (most, most steps) is read once, vectorized.
    auto expired = [&](int64_t r) {
      return static_cast<int64_t>(occupied[r]) &
             static_cast<int64_t>(last_seen[r] != step) &
             static_cast<int64_t>(Sub(step, last_seen[r]) > max_age);
    };
    for (int64_t begin = 0; begin < s.rows; begin += kBlock) {
      const int64_t end = std::min(begin + kBlock, s.rows);
      int64_t any = 0;
      for (int64_t r = begin; r < end; ++r) any |= expired(r);
      if (!any) continue;
      for (int64_t r = begin; r < end; ++r) {
        if (expired(r)) {
          freed_keys.push_back(s.keys[r]);
          occupied[r] = 0;
        }
      }
    }
    const int64_t swept = static_cast<int64_t>(freed_keys.size());
    if (swept == 0) return absl::OkStatus();
    TF_RETURN_IF_ERROR(table->Remove(freed_keys));
    *s.rows_in_use = Sub(*s.rows_in_use, swept);
    *s.evictions = Add(*s.evictions, swept);
    // The free list again: every free row, ascending, then the others. One
    // pass writing at two cursors, without a branch (occupied rows mix with
    // free ones: a branch per row would be mispredicted half the time).
    int64_t free_count = 0;
    for (int64_t r = 0; r < s.rows; ++r) free_count += occupied[r] == 0;
    int64_t free_at = 0, occupied_at = free_count;
    int64_t* __restrict free_rows = s.free_rows;
    for (int64_t r = 0; r < s.rows; ++r) {
      const int64_t held = occupied[r] != 0;
      const int64_t mask = -held;  // the cursor by masks: GCC made ?: a branch
      free_rows[(occupied_at & mask) | (free_at & ~mask)] = r;
      occupied_at += held;
      free_at += 1 - held;
    }
    *s.free_head = 0;
    return absl::OkStatus();
  }

  // Steps 1-6 on the ids in ids_; each one's row into rows_.
  absl::Status Update(OpKernelContext* ctx, Table* table, const State& s,
                      int64_t step) const {
    // 1-2. Every id's row as the table has it; an id with one is counted
    // and seen now, once per occurrence (the same sums as counting each
    // distinct id once by its occurrences); the ids without one, distinct,
    // in first-occurrence order, with their occurrences. (A known id's row
    // stays its own: the sweep and the victims take only rows not seen at
    // this step.)
    const int64_t n = static_cast<int64_t>(ids_.size());
    const int64_t* ids = ids_.data();
    if (n >= (int64_t{1} << 31)) {
      return InvalidArgument("an update takes fewer than 2^31 ids; got ", n);
    }
    TF_RETURN_IF_ERROR(table->Find(ids_, &rows_));
    int64_t* found = rows_.data();
    std::vector<int64_t> miss_at;
    for (int64_t i = 0; i < n; ++i) {
      if (i + kLookAhead < n && found[i + kLookAhead] >= 0) {
        __builtin_prefetch(s.counts + found[i + kLookAhead], 1);
        __builtin_prefetch(s.last_seen + found[i + kLookAhead], 1);
      }
      const int64_t row = found[i];
      TF_RETURN_IF_ERROR(CheckRow(row, s.rows));
      if (row >= 0) {
        s.counts[row] = Add(s.counts[row], 1);
        s.last_seen[row] = step;
      } else {
        miss_at.push_back(i);
      }
    }
    const int64_t misses = static_cast<int64_t>(miss_at.size());
    std::vector<int64_t> new_ids, new_occurrences, miss_number(misses);
    numbers_.Start(misses);
    for (int64_t k = 0; k < misses; ++k) {
      bool added;
      const int64_t id = ids[miss_at[k]];
      miss_number[k] = numbers_.Insert(id, new_ids.size(), &added);
      if (added) {
        new_ids.push_back(id);
        new_occurrences.push_back(1);
      } else {
        ++new_occurrences[miss_number[k]];
      }
    }

    // 3. The "age" sweep, before any admission.
    if (eviction_ == Eviction::kAge) TF_RETURN_IF_ERROR(Sweep(table, s, step));

    // 4. The sketch counts every new id, then each reads its estimate.
    // Cell r * W + bucket_r(id) of hash row r at cells[r * m + j].
    const int64_t m = static_cast<int64_t>(new_ids.size());
    const uint64_t width = static_cast<uint64_t>(s.width);
    // The automatic width is a power of 2: a mask, the same remainder.
    const bool power_of_two = (width & (width - 1)) == 0;
    std::vector<int64_t> cells(2 * m);
    for (int r = 0; r < 2; ++r) {
      for (int64_t j = 0; j < m; ++j) {
        const uint64_t h =
            SplitMix64(static_cast<uint64_t>(new_ids[j]) ^ sketch_salts_[r]);
        const uint64_t bucket = power_of_two ? h & (width - 1) : h % width;
        cells[r * m + j] = r * s.width + static_cast<int64_t>(bucket);
      }
    }
    for (int r = 0; r < 2; ++r) {
      for (int64_t j = 0; j < m; ++j) {
        const int64_t c = r * m + j;
        if (c + kLookAhead < 2 * m) {
          __builtin_prefetch(s.sketch + cells[c + kLookAhead], 1);
        }
        s.sketch[cells[c]] = Add(s.sketch[cells[c]], new_occurrences[j]);
      }
    }
    std::vector<int64_t> candidates, candidate_occurrences, candidate_at;
    int64_t new_total = 0;
    for (int64_t j = 0; j < m; ++j) {
      new_total = Add(new_total, new_occurrences[j]);
      const int64_t estimate =
          std::min(s.sketch[cells[j]], s.sketch[cells[m + j]]);
      bool candidate = estimate >= admit_after_;
      if (candidate && admit_below_ < kAlwaysLucky) {
        const uint64_t id = static_cast<uint64_t>(new_ids[j]);
        const uint64_t mixed = SplitMix64(id ^ admit_salt_) ^
                               static_cast<uint64_t>(step);
        candidate = (SplitMix64(mixed) >> 11) <
                    static_cast<uint64_t>(admit_below_);
      }
      if (candidate) {
        candidates.push_back(new_ids[j]);
        candidate_occurrences.push_back(new_occurrences[j]);
        candidate_at.push_back(j);
      }
    }

    // 5. Rows for the candidates: free ones in ascending order, then
    // victims by (score, row).
    const int64_t wanted = static_cast<int64_t>(candidates.size());
    const int64_t in_use = *s.rows_in_use;
    const int64_t fresh = std::min(wanted, s.rows - in_use);
    std::vector<int64_t> rows;
    rows.reserve(wanted);
    if (eviction_ == Eviction::kAge) {
      const int64_t head = *s.free_head;
      if (head < 0 || head > s.rows - fresh) {
        return InvalidArgument("free_head is ", head, " with ", fresh,
                               " free rows wanted of ", s.rows);
      }
      rows.assign(s.free_rows + head, s.free_rows + head + fresh);
      *s.free_head = head + fresh;
    } else {
      for (int64_t r = in_use; r < in_use + fresh; ++r) rows.push_back(r);
    }
    std::vector<int64_t> victim_keys;
    if (eviction_ != Eviction::kNone && wanted > fresh) {
      for (int64_t row : Victims(s, eviction_, step, wanted - fresh)) {
        victim_keys.push_back(s.keys[row]);
        rows.push_back(row);
      }
    }
    const int64_t given = static_cast<int64_t>(rows.size());
    candidates.resize(given);
    TF_RETURN_IF_ERROR(table->Remove(victim_keys));
    TF_RETURN_IF_ERROR(table->Insert(candidates, rows));
    int64_t admitted_occurrences = 0;
    std::vector<int64_t> new_rows(m, -1);  // each new id's row, or -1
    for (int64_t j = 0; j < given; ++j) {
      const int64_t row = rows[j];
      s.keys[row] = candidates[j];
      s.occupied[row] = true;
      s.counts[row] = candidate_occurrences[j];
      s.last_seen[row] = step;
      new_rows[candidate_at[j]] = row;
      admitted_occurrences = Add(admitted_occurrences, candidate_occurrences[j]);
    }
    *s.rows_in_use = Add(*s.rows_in_use, fresh);
    *s.admissions = Add(*s.admissions, given);
    *s.evictions =
        Add(*s.evictions, static_cast<int64_t>(victim_keys.size()));
    *s.refused = Add(*s.refused, Sub(new_total, admitted_occurrences));

    // 6. Each input id's row.
    int64_t without_row = 0;
    for (int64_t k = 0; k < misses; ++k) {
      const int64_t row = new_rows[miss_number[k]];
      found[miss_at[k]] = row;
      without_row += row < 0;
    }
    *s.default_hits = Add(*s.default_hits, without_row);
    Tensor* reset_t = nullptr;
    TF_RETURN_IF_ERROR(
        ctx->allocate_output("reset_rows", TensorShape({given}), &reset_t));
    std::copy(rows.begin(), rows.end(), reset_t->flat<int64_t>().data());
    return absl::OkStatus();
  }

  Eviction eviction_ = Eviction::kLru;
  int64_t admit_after_ = 1;
  int64_t admit_below_ = kAlwaysLucky;
  int64_t max_age_ = 0;
  int64_t evict_every_ = 1;
  uint64_t sketch_salts_[2] = {0, 0};
  uint64_t admit_salt_ = 0;
  std::vector<bool> padded_;
  // Scratch kept between calls (a fresh one would be page faults at every
  // call): the batch's ids, their rows, step 1's table (FirstOccurrence).
  mutable tensorflow::mutex scratch_mu_;
  mutable std::vector<int64_t> ids_;
  mutable std::vector<int64_t> rows_;
  mutable FirstOccurrence numbers_;
};

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

REGISTER_OP("RecsysVocabularyUpdate")
    .Input("table: resource")
    .Input("keys: resource")
    .Input("occupied: resource")
    .Input("counts: resource")
    .Input("last_seen: resource")
    .Input("sketch_cells: resource")
    .Input("rows_in_use: resource")
    .Input("admissions: resource")
    .Input("evictions: resource")
    .Input("refused: resource")
    .Input("default_hits: resource")
    .Input("free_list: num_free * resource")
    .Input("ids: num_pieces * int64")
    .Input("lengths: num_pieces * int64")
    .Input("step: int64")
    .Output("rows: num_pieces * int64")
    .Output("reset_rows: int64")
    .Attr("num_free: int >= 0")
    .Attr("num_pieces: int >= 1")
    .Attr("padded: list(bool)")
    .Attr("eviction: {'none', 'lru', 'lfu', 'age'}")
    .Attr("admit_after: int")
    .Attr("admit_below: int")
    .Attr("sketch_salt_0: int")
    .Attr("sketch_salt_1: int")
    .Attr("admit_salt: int")
    .Attr("max_age: int = 0")
    .Attr("evict_every: int = 1")
    .SetIsStateful()
    .SetShapeFn([](InferenceContext* c) {
      std::vector<tensorflow::shape_inference::ShapeHandle> ids;
      TF_RETURN_IF_ERROR(c->input("ids", &ids));
      for (size_t p = 0; p < ids.size(); ++p) c->set_output(p, ids[p]);
      c->set_output(ids.size(), c->Vector(c->UnknownDim()));
      return absl::OkStatus();
    })
    .Doc("VocabularyIndex.update (backends/vocabulary/index.py) in one op, "
         "on the index's own hash table and variables.");

REGISTER_KERNEL_BUILDER(Name("RecsysVocabularyUpdate").Device(DEVICE_CPU),
                        VocabularyUpdateOp);

}  // namespace
}  // namespace recsys
