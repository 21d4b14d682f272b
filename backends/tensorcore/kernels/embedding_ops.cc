// Fused CPU kernels for the tensorcore backend's training step.
//
// The pure-TF step of one table runs Unique, ResourceGather, SparseSegmentSum,
// SparseSegmentSumGrad and a gather / compute / scatter of the optimizer: each
// a pass over memory with its own scheduling overhead, and SparseSegmentSumGrad
// alone was the largest cost in the profile. These kernels do the same work
// in one pass each:
//
//   RecsysBagLookup     de-duplicates ids (first-occurrence order, as
//                       tf.unique) and sums scale * table[id] into each
//                       id's segment, reading rows straight from the variable
//   RecsysBagSums,      the lookup's bag sums and its de-duplication as two
//   RecsysBagDedup      ops, for steps of fewer tables than inter-op threads:
//                       the executor runs the de-duplication beside the sums
//                       and the dense model (backends/_bags.py)
//   RecsysPaddedBags    the real entries of padded [B, W] bags as flat values
//                       with their rows and positions (replaces range / less /
//                       where / gather_nd of the padded input); optionally
//                       checks the ids' range (replaces six ops per feature)
//                       or leaves out the ids outside it, counted (the "drop"
//                       policy: three boolean masks per feature)
//   RecsysRowGradients  row_grads[index[i]] += scale[i] * grads[segments[i]]
//   RecsysSparseApply   gradient clipping, weight decay, the SGD / Adagrad /
//                       lazy Adam update and weight clipping of the touched
//                       rows, in place (docs/optimizers.md, the same float32
//                       operations in the same order as backends/optimizers.py)
//   RecsysBagApply      RecsysRowGradients then RecsysSparseApply in one op:
//                       the training step's backward pass and update of a
//                       table (one op per table instead of two, and the rows'
//                       gradients stay a scratch buffer in cache)
//
// Variables are accessed like TF's own sparse resource ops: the first sparse
// access switches the variable to copy-on-read mode (copying its buffer if a
// dense read still aliases it), reads take the variable's lock shared, updates
// exclusive.
//
// Threads: by default (RECSYS_KERNEL_PARALLEL_MIN_WORK unset or `auto`), a
// call whose step leaves intra-op threads idle (it runs fewer such calls side
// by side than the pool has threads: the `concurrent_calls` attr, the step's
// tables x replicas, set by backends/_bags.py) and that moves at least 65536
// floats of rows splits its row loops over the idle threads: one big table
// gets the whole pool, the standard 8-table step no split (its tables already
// run concurrently on the inter-op threads, and a fork-join there only waits
// for busy threads: about 2x slower when forced on this project's 2-core
// machine). RECSYS_KERNEL_PARALLEL_MIN_WORK=N forces every call of N floats or
// more to split; any other value keeps every call on one thread. The split
// is by output: the unique ids and index apart from bags' segments (lookup),
// unique rows (row gradients, and their update in RecsysBagApply), table rows
// (RecsysSparseApply), batch rows (padded bags). Each output element is still
// computed by one thread, adding its terms in the same order as the
// one-thread loop, so results are bit-identical for any number of threads
// (crash-resume tests compare states exactly). The lookup runs its two jobs
// side by side: one thread de-duplicates all ids (the one-thread loop), the
// others sum the bags of their ranges of segments; the backward pass and
// update split the unique rows into ranges of about equal work.
//
// Narrow tables (backends/storage/narrow.py): the table variable may hold bfloat16
// or float16 rows (slots stay float32). Lookups read the rows narrow and
// upcast each value to float32 (exact) before summing; updates compute in
// float32 and write each new value back with narrow.py's stochastic rounding
// (the same counter-based hash of the seed, the update step, row and column;
// the seed an attr, the step an input), so the kernels and the TF ops leave
// bit-identical tables, for any number of threads. A finite value beyond
// the row type's largest finite one saturates to it (narrow.saturate);
// RecsysSparseApply and RecsysBagApply output how many values saturated and
// the largest magnitude among them, which backends/optimizers.py adds to
// the table's counters (narrow.Saturation).
//
// Built by `python -m backends.tensorcore.kernels` (backends/tensorcore/kernels/
// __init__.py) with -ffp-contract=off, so that no multiply-add is fused (the
// TF ops round each operation separately), and -fno-math-errno, so that the
// row loops with sqrt vectorize.

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <immintrin.h>
#include <limits>
#include <string>
#include <type_traits>
#include <vector>

#include "tensorflow/core/framework/op.h"
#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/resource_mgr.h"
#include "tensorflow/core/framework/resource_var.h"
#include "tensorflow/core/framework/shape_inference.h"
#include "tensorflow/core/framework/numeric_types.h"
#include "tensorflow/core/platform/threadpool.h"

#include "kernel_common.h"

namespace recsys {
namespace {

using ::tensorflow::errors::InvalidArgument;
using ::tensorflow::shape_inference::InferenceContext;

// Looks up the float32 matrix variable behind resource input `index`
// (`narrow`: or bfloat16 / float16, a narrow table's rows).
absl::Status LookupMatrix(OpKernelContext* ctx, int index, const char* what,
                          tsl::core::RefCountPtr<Var>* var,
                          bool narrow = false) {
  TF_RETURN_IF_ERROR(tensorflow::LookupResource(
      ctx, tensorflow::HandleFromInput(ctx, index), var));
  TF_RETURN_IF_ERROR(EnsureSparseAccess(ctx, var->get()));
  const Tensor& t = *(*var)->tensor();
  const auto dtype = t.dtype();
  const bool ok_dtype =
      dtype == tensorflow::DT_FLOAT ||
      (narrow && (dtype == tensorflow::DT_BFLOAT16 ||
                  dtype == tensorflow::DT_HALF));
  if (!ok_dtype || t.dims() != 2) {
    return InvalidArgument(what, " must be a ",
                           narrow ? "float32, bfloat16 or float16"
                                  : "float32",
                           " matrix variable; got ",
                           tensorflow::DataTypeString(t.dtype()), " ",
                           t.shape().DebugString());
  }
  return absl::OkStatus();
}

// Floats of row traffic (ids x dim) from which a call splits over the
// intra-op pool when the step leaves threads idle (see NumParts).
constexpr int64_t kAutoMinWork = int64_t{1} << 16;
constexpr int64_t kAuto = -1;   // split calls the step leaves threads for
constexpr int64_t kNever = -2;  // every call on one thread
// Without RECSYS_KERNEL_PARALLEL_MIN_WORK: the automatic split. On the quiet
// 2-core machine it made the step of one 10^7-row table 1.2x faster at batch
// 16,384 (1.1x at 4,096) for ~10 % more CPU, and leaves the 8-table step
// unchanged (README, "One big table on 1 vs 2 threads").
constexpr int64_t kDefault = kAuto;

// RECSYS_KERNEL_PARALLEL_MIN_WORK: unset (kDefault), `auto` (kAuto), a number
// N >= 0 (split any call of N floats or more over the whole pool, whatever
// runs beside it), or anything else (kNever).
int64_t ForcedMinWork() {
  static const int64_t value = [] {
    const char* env = std::getenv("RECSYS_KERNEL_PARALLEL_MIN_WORK");
    if (env == nullptr || *env == '\0') return kDefault;
    if (std::strcmp(env, "auto") == 0) return kAuto;
    char* end = nullptr;
    const long long v = std::strtoll(env, &end, 10);
    return (end != env && *end == '\0' && v >= 0) ? static_cast<int64_t>(v)
                                                  : kNever;
  }();
  return value;
}

// How many parts to split a call of `work` floats into. `concurrent_calls`
// is how many such calls the step runs side by side (the tables of the step
// times the local replicas; 0: unknown). By default a call splits only when
// the step leaves intra-op threads idle: a step of one big table gets the
// whole pool, the 8-table step none (its tables already run concurrently on
// the inter-op threads, and a fork-join there only waits for busy threads).
int NumParts(OpKernelContext* ctx, int64_t work, int concurrent_calls) {
  const auto* threads = ctx->device()->tensorflow_cpu_worker_threads();
  if (threads == nullptr || threads->workers == nullptr) return 1;
  const int n = threads->workers->NumThreads();
  const int64_t forced = ForcedMinWork();
  if (n <= 1 || forced == kNever) return 1;
  if (forced != kAuto) return work >= forced ? n : 1;
  if (concurrent_calls <= 0 || work < kAutoMinWork) return 1;
  return std::max(1, n / concurrent_calls);
}

// Runs fn(part) for part in [0, parts) on the intra-op pool, one task each.
void RunParts(OpKernelContext* ctx, int parts,
              const std::function<void(int)>& fn) {
  ctx->device()->tensorflow_cpu_worker_threads()->workers->ParallelFor(
      parts, [&fn](int64_t begin, int64_t end) {
        for (int64_t k = begin; k < end; ++k) fn(static_cast<int>(k));
      });
}

// Where a table row goes among `parts`: a multiplicative hash (Zipf-hot low
// ids spread over the parts; all updates of one row land in one part).
inline int RowPart(int64_t id, int parts) {
  const uint64_t h =
      (static_cast<uint64_t>(id) * 0xD6E8FEB86659FD93ull) >> 16 & 0xFFFFFFFFull;
  return static_cast<int>((h * static_cast<uint64_t>(parts)) >> 32);
}

// Open-addressing map from id to its first-occurrence position. Fibonacci
// hashing: the top bits of id * 2^64/phi index the slots, so ids sharing low
// bits (multiples of a power of two) still spread.
class IdIndex {
 public:
  explicit IdIndex(int64_t n)
      : slots_(n), keys_(slots_.size(), -1), values_(slots_.size()) {}
  // The position of `id` (non-negative), adding it as `next` if new.
  int32_t Insert(int64_t id, int32_t next, bool* added) {
    int64_t slot =
        slots_.First(static_cast<uint64_t>(id) * 0x9E3779B97F4A7C15ull);
    while (true) {
      if (keys_[slot] == id) { *added = false; return values_[slot]; }
      if (keys_[slot] < 0) {
        keys_[slot] = id; values_[slot] = next; *added = true; return next;
      }
      slot = slots_.Next(slot);
    }
  }

 private:
  HashSlots slots_;
  std::vector<int64_t> keys_;
  std::vector<int32_t> values_;
};

absl::Status CheckBags(const Tensor& ids, const Tensor& segments,
                       const Tensor& scale) {
  if (ids.dims() != 1 || segments.dims() != 1 ||
      ids.NumElements() != segments.NumElements()) {
    return InvalidArgument("ids and segments must be vectors of one length; "
                           "got ", ids.shape().DebugString(), " and ",
                           segments.shape().DebugString());
  }
  if (scale.NumElements() != 0 && scale.NumElements() != ids.NumElements()) {
    return InvalidArgument("scale must be empty or have one value per id; "
                           "got ", scale.NumElements(), " for ",
                           ids.NumElements(), " ids");
  }
  return absl::OkStatus();
}

// A lookup's bag inputs 1-4 (ids, segments, scale, num_segments), checked:
// the entry count, num_segments and the scale (nullptr: every entry weighs 1).
absl::Status ReadBagInputs(OpKernelContext* ctx, int64_t* n,
                           int32_t* num_segments, const float** scale) {
  const Tensor& ids = ctx->input(1);
  const Tensor& scale_t = ctx->input(3);
  TF_RETURN_IF_ERROR(CheckBags(ids, ctx->input(2), scale_t));
  *num_segments = ctx->input(4).scalar<int32_t>()();
  if (*num_segments < 0) return InvalidArgument("num_segments must be >= 0");
  *n = ids.NumElements();
  *scale = scale_t.NumElements() ? scale_t.flat<float>().data() : nullptr;
  return absl::OkStatus();
}

// Whether entry (id, segment) lies in the table's rows and the segments.
inline bool ValidEntry(int64_t id, int32_t seg, int64_t vocab,
                       int32_t num_segments) {
  return id >= 0 && id < vocab && seg >= 0 && seg < num_segments;
}

// The error of an entry that is not ValidEntry (its id first), at position i.
absl::Status EntryError(int64_t id, int32_t seg, int64_t i, int64_t vocab,
                        int32_t num_segments) {
  if (id < 0 || id >= vocab) {
    return InvalidArgument("id ", id, " at position ", i,
                           " is outside the table's rows [0, ", vocab, ")");
  }
  return InvalidArgument("segment ", seg, " at position ", i,
                         " is outside [0, ", num_segments, ")");
}

// Numbers the distinct ids[0..n) in first-occurrence order: index[i] is the
// number of ids[i], `unique` lists them. Stops at the first id outside
// [0, num_rows) and returns its position, or n when every id is in range.
int64_t DedupIds(const int64_t* ids, int64_t n, int64_t num_rows,
                 IdIndex* positions, std::vector<int64_t>* unique,
                 int32_t* index) {
  for (int64_t i = 0; i < n; ++i) {
    const int64_t id = ids[i];
    if (id < 0 || id >= num_rows) return i;
    bool added;
    index[i] = positions->Insert(id, static_cast<int32_t>(unique->size()),
                                 &added);
    if (added) unique->push_back(id);
  }
  return n;
}

// Entries prefetched ahead in the row loops: their rows are random in memory.
// Every cache line of the row (a 32-float row spans two): on the standard
// 8-table step, 8 entries ahead and whole rows took 13 % less CPU and wall
// time than 4 ahead and the first line only (README, Benchmarks).
constexpr int kLookAhead = 8;

using Bf16 = Eigen::bfloat16;
using Half = Eigen::half;

// Prefetches every cache line (64 bytes) of a row of `dim` values.
template <typename T>
inline void PrefetchRow(const T* row, int64_t dim) {
  for (int64_t d = 0; d < dim; d += 64 / sizeof(T)) __builtin_prefetch(row + d);
}
template <typename T>
inline void PrefetchRowForWrite(T* row, int64_t dim) {
  for (int64_t d = 0; d < dim; d += 64 / sizeof(T)) {
    __builtin_prefetch(row + d, 1);
  }
}

// A stored value as float32 (exact for every row type).
inline float ToFloat(float x) { return x; }
inline float ToFloat(Bf16 x) {
  // bfloat16 is the top half of a float32: a shift (vectorizes).
  uint16_t bits;
  std::memcpy(&bits, &x, sizeof(bits));
  const uint32_t wide = static_cast<uint32_t>(bits) << 16;
  float out;
  std::memcpy(&out, &wide, sizeof(out));
  return out;
}
inline float ToFloat(Half x) { return static_cast<float>(x); }

// backends/storage/narrow.py's hash (`_mix`, lowbias32), on uint32.
inline uint32_t Mix(uint32_t x) {
  x ^= x >> 16;
  x *= 0x7FEB352Du;
  x ^= x >> 15;
  x *= 0x846CA68Bu;
  return x ^ (x >> 16);
}

// One update's rounding draws (narrow.random_bits): `key` hashes the seed
// and the update step; a row's hash mixes in its id, each column's is fixed.
struct Rounding {
  uint32_t key = 0;
  std::vector<uint32_t> columns;

  Rounding(int64_t seed, int64_t step, int64_t dim) {
    const uint64_t s = static_cast<uint64_t>(step);
    key = Mix(static_cast<uint32_t>(static_cast<uint64_t>(seed)) ^ 0x9E3779B9u);
    key = Mix(key ^ static_cast<uint32_t>(s & 0xFFFFFFFFu));
    key = Mix(key ^ static_cast<uint32_t>(s >> 32));
    columns.resize(dim);
    for (int64_t d = 0; d < dim; ++d) {
      columns[d] = Mix(static_cast<uint32_t>(d) + 0x632BE5ABu);
    }
  }

  inline uint32_t Row(int64_t id) const {
    const uint64_t u = static_cast<uint64_t>(id);
    return Mix(Mix(key ^ static_cast<uint32_t>(u & 0xFFFFFFFFu)) ^
               static_cast<uint32_t>(u >> 32));
  }
};

// The draw of one element: narrow.random_bits's per-column step.
inline uint32_t Draw(uint32_t row_hash, uint32_t column_hash) {
  uint32_t bits = (row_hash ^ column_hash) * 0x846CA68Bu;
  return bits ^ (bits >> 16);
}

// The bits of the largest finite value of a narrow row type, as a float32:
// a finite value of larger magnitude saturates to it (narrow.saturate).
// Magnitudes' bits are compared as int32 (non-negative: the sign bit is
// cleared), which AVX2 compares in one instruction (uint32 in three).
constexpr int32_t kLargestBf16Bits = 0x7F7F0000;  // 3.3895314e38
constexpr int32_t kLargestHalfBits = 0x477FE000;  // 65504
constexpr int32_t kInfBits = 0x7F800000;

// What an update saturated (narrow.saturated): the count of values beyond
// the row type's range, and the largest magnitude among them as float32
// bits (a magnitude's bits order as the magnitudes do).
struct Saturated {
  int64_t count = 0;
  uint32_t largest_bits = 0;

  void Add(const Saturated& other) {
    count += other.count;
    largest_bits = std::max(largest_bits, other.largest_bits);
  }
};

// narrow.round_stochastically of one float32 value, for bfloat16 rows (and
// float32 ones, unchanged); float16: RoundHalfValue.
inline Bf16 RoundTo(Bf16*, float x, uint32_t bits) {
  uint32_t value;
  std::memcpy(&value, &x, sizeof(value));
  // Beyond the largest finite bfloat16: saturated to it (with its sign), as
  // narrow.saturate; a carry from it would reach inf.
  const int32_t magnitude = static_cast<int32_t>(value & 0x7FFFFFFFu);
  const bool beyond = magnitude > kLargestBf16Bits && magnitude < kInfBits;
  value = beyond ? (value & 0x80000000u) | uint32_t{kLargestBf16Bits} : value;
  const uint32_t kept = (value + (bits >> 16)) & 0xFFFF0000u;
  // Exact in bfloat16: its top half, as TF's cast of it, but for a NaN,
  // which the cast (Eigen's) makes the quiet NaN of its sign. A select, not
  // a branch: the row loop vectorizes.
  const bool nan = (kept & 0x7FFFFFFFu) > 0x7F800000u;
  const uint16_t out = static_cast<uint16_t>(
      nan ? ((kept >> 16) & 0x8000u) | 0x7FC0u : kept >> 16);
  return Eigen::numext::bit_cast<Bf16>(out);
}
inline float RoundTo(float*, float x, uint32_t) { return x; }

// narrow.round_stochastically of one float32 value into float16, as a
// float32 (exact in float16), without conversions, so that a row of them
// vectorizes (then stored 8 at a time by FloatRowToHalf): the neighbours of |x| are its float32
// bits cut to float16's 10 fraction bits (normal), or multiples of 2^-24
// (subnormal); beyond the largest finite float16 (65504) it saturates, as
// the TF ops' pick (its neighbour above is inf, drawn with probability 0).
inline float RoundHalfValue(float x, uint32_t bits) {
  const float draw = static_cast<float>(bits >> 8) * 0x1p-24f;
  const float a = std::fabs(x);
  uint32_t a_bits;
  std::memcpy(&a_bits, &a, sizeof(a_bits));
  const uint32_t low_bits = a_bits & 0xFFFFE000u;
  const uint32_t high_bits = low_bits + 0x2000u;
  float low_normal, high_normal;
  std::memcpy(&low_normal, &low_bits, sizeof(low_normal));
  std::memcpy(&high_normal, &high_bits, sizeof(high_normal));
  // Every value computed before the selects: selects of computed values
  // if-convert (the row loop vectorizes); a computation under one does not.
  const float steps = std::floor(a * 0x1p24f);
  const float low_subnormal = steps * 0x1p-24f;
  const float high_subnormal = (steps + 1.0f) * 0x1p-24f;
  const bool normal = a >= 0x1p-14f;
  const float low = normal ? low_normal : low_subnormal;
  const float high = normal ? high_normal : high_subnormal;
  const float up = (a - low) / (high - low);
  float r = draw < up ? high : low;
  r = a >= 65504.0f ? 65504.0f : r;
  r = a < std::numeric_limits<float>::infinity() ? r : a;  // inf, NaN stay
  const float negated = -r;
  return x < 0.0f ? negated : r;
}

// A row of float16 values as float32 (exact; F16C: 8 at a time).
inline void HalfRowToFloat(const Half* in, int64_t dim, float* out) {
  int64_t d = 0;
#ifdef __F16C__
  for (; d + 8 <= dim; d += 8) {
    const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(in + d));
    _mm256_storeu_ps(out + d, _mm256_cvtph_ps(h));
  }
#endif
  for (; d < dim; ++d) out[d] = static_cast<float>(in[d]);
}

// A row of float32 values exact in float16 stored as float16.
inline void FloatRowToHalf(const float* in, int64_t dim, Half* out) {
  int64_t d = 0;
#ifdef __F16C__
  for (; d + 8 <= dim; d += 8) {
    const __m128i h =
        _mm256_cvtps_ph(_mm256_loadu_ps(in + d), _MM_FROUND_TO_NEAREST_INT);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(out + d), h);
  }
#endif
  for (; d < dim; ++d) out[d] = Half(in[d]);
}

// Sums terms into rows of `out` (dim floats each) that start at 0, without
// a separate pass zeroing them: rows [begin, ready) hold their sums so far;
// the first term of a row past them is written as 0.0f + term (the same bits
// as zeroing then adding: 0.0f + -0.0f is 0.0f), after zeroing the rows it
// skipped. Finish() zeroes the rows no term reached. Rows touched in
// increasing order of first touch (the lookup's bags in segment order, the
// unique rows in first-occurrence order) never skip, so nothing is zeroed.
class LazyRows {
 public:
  LazyRows(float* out, int64_t dim, int64_t begin, int64_t end)
      : out_(out), dim_(dim), ready_(begin), end_(end) {}

  // out[row] += scale * term (scale_given) or += term.
  // A narrow term is upcast to float32 (exact) first.
  template <typename T>
  inline void Add(int64_t row, const T* term, bool scale_given, float scale) {
    if constexpr (std::is_same_v<T, Half>) {  // upcast 8 at a time first
      if (static_cast<int64_t>(half_row_.size()) < dim_) half_row_.resize(dim_);
      HalfRowToFloat(term, dim_, half_row_.data());
      Add(row, static_cast<const float*>(half_row_.data()), scale_given, scale);
      return;
    }
    float* o = out_ + row * dim_;
    if (row < ready_) {
      if (scale_given) {
        for (int64_t d = 0; d < dim_; ++d) o[d] += ToFloat(term[d]) * scale;
      } else {
        for (int64_t d = 0; d < dim_; ++d) o[d] += ToFloat(term[d]);
      }
      return;
    }
    std::fill(out_ + ready_ * dim_, o, 0.0f);
    if (scale_given) {
      for (int64_t d = 0; d < dim_; ++d) o[d] = 0.0f + ToFloat(term[d]) * scale;
    } else {
      for (int64_t d = 0; d < dim_; ++d) o[d] = 0.0f + ToFloat(term[d]);
    }
    ready_ = row + 1;
  }

  void Finish() {
    if (ready_ < end_) std::fill(out_ + ready_ * dim_, out_ + end_ * dim_, 0.0f);
    ready_ = end_;
  }

 private:
  float* out_;
  int64_t dim_, ready_, end_;
  std::vector<float> half_row_;  // a float16 term upcast
};

// RecsysBagSums (BagSumsOp, below): the lookup's bag sums alone
// (RecsysBagLookup's one-thread loop without its de-duplication, the same
// checks and messages). RecsysBagDedup: its de-duplication alone (unique ids
// in first-occurrence order, each id's index), ids checked against
// [0, num_rows). Two ops with no dependency, so that for a step of few
// tables the executor runs the de-duplication (needed only by the update) on
// another inter-op thread beside the sums and the dense model, with no
// fork-join.
class BagDedupOp : public OpKernel {
 public:
  explicit BagDedupOp(OpKernelConstruction* ctx) : OpKernel(ctx) {
    OP_REQUIRES_OK(ctx, ctx->GetAttr("num_rows", &num_rows_));
  }

  void Compute(OpKernelContext* ctx) override {
    const Tensor& ids_t = ctx->input(0);
    OP_REQUIRES(ctx, ids_t.dims() == 1,
                InvalidArgument("ids must be a vector; got ",
                                ids_t.shape().DebugString()));
    const int64_t n = ids_t.NumElements();
    const auto ids = ids_t.flat<int64_t>();
    Tensor* index_t = nullptr;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(1, TensorShape({n}), &index_t));
    int32_t* index = index_t->flat<int32_t>().data();
    std::vector<int64_t> unique;
    unique.reserve(std::min<int64_t>(n, num_rows_));
    IdIndex positions(n);
    const int64_t bad =
        DedupIds(ids.data(), n, num_rows_, &positions, &unique, index);
    OP_REQUIRES(ctx, bad == n, EntryError(ids(bad), 0, bad, num_rows_, 1));
    Tensor* unique_t = nullptr;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(
        0, TensorShape({static_cast<int64_t>(unique.size())}), &unique_t));
    std::copy(unique.begin(), unique.end(), unique_t->flat<int64_t>().data());
  }

 private:
  int64_t num_rows_ = 0;
};

// A row-sharded table's all-to-all send buffer in one pass
// (backends/storage/exchange.py, `_buckets` and the scatter after it): id i
// takes the next slot of its owner's bucket of `capacity`, in order; an
// invalid id, or one past its bucket, gets slot num_shards * capacity (not
// sent). `send` holds each slot's local row (0 where unfilled); `counts`
// each owner's ids, past `capacity` when its bucket overflows.
class BucketsOp : public OpKernel {
 public:
  explicit BucketsOp(OpKernelConstruction* ctx) : OpKernel(ctx) {
    OP_REQUIRES_OK(ctx, ctx->GetAttr("num_shards", &num_shards_));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("capacity", &capacity_));
  }

  void Compute(OpKernelContext* ctx) override {
    const Tensor& owner_t = ctx->input(0);
    const Tensor& local_t = ctx->input(1);
    const Tensor& valid_t = ctx->input(2);
    const int64_t n = owner_t.NumElements();
    OP_REQUIRES(ctx,
                owner_t.dims() == 1 && local_t.dims() == 1 &&
                    valid_t.dims() == 1 && local_t.NumElements() == n &&
                    valid_t.NumElements() == n,
                InvalidArgument("owner, local and valid must be vectors of "
                                "one length"));
    const int32_t* owner = owner_t.flat<int32_t>().data();
    const int64_t* local = local_t.flat<int64_t>().data();
    const bool* valid = valid_t.flat<bool>().data();
    const int64_t total = num_shards_ * capacity_;
    Tensor *slot_t = nullptr, *send_t = nullptr, *counts_t = nullptr;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, TensorShape({n}), &slot_t));
    OP_REQUIRES_OK(ctx, ctx->allocate_output(1, TensorShape({total}), &send_t));
    OP_REQUIRES_OK(ctx,
                   ctx->allocate_output(2, TensorShape({num_shards_}), &counts_t));
    int32_t* slot = slot_t->flat<int32_t>().data();
    int64_t* send = send_t->flat<int64_t>().data();
    int32_t* counts = counts_t->flat<int32_t>().data();
    std::memset(send, 0, sizeof(int64_t) * total);
    std::memset(counts, 0, sizeof(int32_t) * num_shards_);
    for (int64_t i = 0; i < n; ++i) {
      const int32_t o = owner[i];
      if (!valid[i]) {
        slot[i] = static_cast<int32_t>(total);
        continue;
      }
      OP_REQUIRES(ctx, o >= 0 && o < num_shards_,
                  InvalidArgument("owner ", o, " of entry ", i,
                                  " is outside [0, ", num_shards_, ")"));
      const int64_t position = counts[o]++;
      if (position < capacity_) {
        slot[i] = static_cast<int32_t>(o * capacity_ + position);
        send[o * capacity_ + position] = local[i];
      } else {
        slot[i] = static_cast<int32_t>(total);
      }
    }
  }

 private:
  int64_t num_shards_ = 1;
  int64_t capacity_ = 0;
};

class BagLookupOp : public OpKernel {
 public:
  // sums_only: RecsysBagSums, the activations alone (one thread, no
  // de-duplication).
  explicit BagLookupOp(OpKernelConstruction* ctx, bool sums_only = false)
      : OpKernel(ctx), sums_only_(sums_only) {
    if (!sums_only_) {
      OP_REQUIRES_OK(ctx,
                     ctx->GetAttr("concurrent_calls", &concurrent_calls_));
    }
  }

  void Compute(OpKernelContext* ctx) override {
    tsl::core::RefCountPtr<Var> table;
    OP_REQUIRES_OK(ctx, LookupMatrix(ctx, 0, "table", &table, true));
    switch (table->tensor()->dtype()) {
      case tensorflow::DT_BFLOAT16: Lookup<Bf16>(ctx, table.get()); break;
      case tensorflow::DT_HALF: Lookup<Half>(ctx, table.get()); break;
      default: Lookup<float>(ctx, table.get()); break;
    }
  }

 private:
  // The lookup of a table whose rows are of type T.
  template <typename T>
  void Lookup(OpKernelContext* ctx, Var* table) {
    int64_t n = 0;
    int32_t num_segments = 0;
    const float* scale = nullptr;
    OP_REQUIRES_OK(ctx, ReadBagInputs(ctx, &n, &num_segments, &scale));
    const auto ids = ctx->input(1).flat<int64_t>();
    const auto segments = ctx->input(2).flat<int32_t>();

    tsl::tf_shared_lock lock(*table->mu());
    const Tensor& params = *table->tensor();
    const int64_t vocab = params.dim_size(0), dim = params.dim_size(1);
    const T* rows = reinterpret_cast<const T*>(params.data());

    Tensor* acts_t = nullptr;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(
        0, TensorShape({num_segments, dim}), &acts_t));
    float* acts = acts_t->flat<float>().data();
    Tensor* index_t = nullptr;
    if (!sums_only_) {
      OP_REQUIRES_OK(ctx, ctx->allocate_output(2, TensorShape({n}), &index_t));
    }
    int32_t* index = sums_only_ ? nullptr : index_t->flat<int32_t>().data();

    std::vector<int64_t> unique;
    unique.reserve(sums_only_ ? 0 : std::min<int64_t>(n, vocab));
    IdIndex positions(sums_only_ ? 0 : n);
    const int parts = sums_only_ ? 1 : NumParts(ctx, n * dim, concurrent_calls_);
    if (parts > 1) {
      // Two independent jobs run side by side: part 0 de-duplicates every id
      // (the one-thread loop's probes, in order: the same unique ids and
      // index), parts 1.. sum the bags of their range of segments (the
      // one-thread summation order for each bag). No part scans what another
      // does, and nothing runs serially after them. Each part stops at its
      // first invalid entry; the first bad entry overall is then reported
      // as the one-thread loop reports it.
      const int sum_parts = parts - 1;
      // Sorted segments let each part sum one contiguous range of entries;
      // segments outside [0, num_segments) then lie before the first range
      // or after the last, where no part looks: the ends are checked here.
      const int32_t* seg_data = segments.data();
      const bool sorted =
          sum_parts > 1 && std::is_sorted(seg_data, seg_data + n);
      std::vector<char> bad(parts, 0);
      bad[0] = sorted && n > 0 &&
               (seg_data[0] < 0 || seg_data[n - 1] >= num_segments);
      RunParts(ctx, parts, [&](int part) {
        if (part == 0) {
          bad[0] |= DedupIds(ids.data(), n, vocab, &positions, &unique,
                             index) != n;
          return;
        }
        // Part k sums segments [lo, hi): with sorted segments its entries are
        // one contiguous range, else it filters every entry.
        const int k = part - 1;
        const int64_t lo = int64_t{num_segments} * k / sum_parts;
        const int64_t hi = int64_t{num_segments} * (k + 1) / sum_parts;
        int64_t first = 0, last = n;
        if (sorted) {
          first = std::lower_bound(seg_data, seg_data + n, lo) - seg_data;
          last = std::lower_bound(seg_data, seg_data + n, hi) - seg_data;
        }
        LazyRows out(acts, dim, lo, hi);
        for (int64_t i = first; i < last; ++i) {
          const int64_t id = ids(i);
          const int32_t seg = segments(i);
          if (!ValidEntry(id, seg, vocab, num_segments)) {
            bad[part] = 1;
            break;
          }
          if (seg < lo || seg >= hi) continue;
          if (i + kLookAhead < last) {
            const int64_t ahead = ids(i + kLookAhead);
            if (ahead >= 0 && ahead < vocab) PrefetchRow(rows + ahead * dim, dim);
          }
          out.Add(seg, rows + id * dim, scale != nullptr,
                  scale != nullptr ? scale[i] : 1.0f);
        }
        out.Finish();
      });
      if (std::find(bad.begin(), bad.end(), 1) != bad.end()) {
        for (int64_t i = 0; i < n; ++i) {
          OP_REQUIRES(ctx, ValidEntry(ids(i), segments(i), vocab, num_segments),
                      EntryError(ids(i), segments(i), i, vocab, num_segments));
        }
      }
    } else {
      const bool dedup = !sums_only_;  // a local: the loop is unswitched
      LazyRows out(acts, dim, 0, num_segments);
      for (int64_t i = 0; i < n; ++i) {
        const int64_t id = ids(i);
        const int32_t seg = segments(i);
        OP_REQUIRES(ctx, ValidEntry(id, seg, vocab, num_segments),
                    EntryError(id, seg, i, vocab, num_segments));
        if (i + kLookAhead < n) {
          const int64_t ahead = ids(i + kLookAhead);
          if (ahead >= 0 && ahead < vocab) PrefetchRow(rows + ahead * dim, dim);
        }
        if (dedup) {
          bool added;
          index[i] = positions.Insert(id, static_cast<int32_t>(unique.size()),
                                      &added);
          if (added) unique.push_back(id);
        }
        out.Add(seg, rows + id * dim, scale != nullptr,
                scale != nullptr ? scale[i] : 1.0f);
      }
      out.Finish();
    }
    if (sums_only_) return;
    Tensor* unique_t = nullptr;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(
        1, TensorShape({static_cast<int64_t>(unique.size())}), &unique_t));
    std::copy(unique.begin(), unique.end(), unique_t->flat<int64_t>().data());
  }

  bool sums_only_;
  int concurrent_calls_ = 0;
};

// RecsysBagSums: see BagDedupOp.
class BagSumsOp : public BagLookupOp {
 public:
  explicit BagSumsOp(OpKernelConstruction* ctx) : BagLookupOp(ctx, true) {}
};

// out[r] = sum of scale[i] * grads[segments[i]] over the entries i with
// index[i] == r, added in entry order, for the rows r in [lo, hi) (zeroed
// first; out points at row 0). Entries must be in range.
void SumRowGradients(const float* grads, const int32_t* index,
                     const int32_t* segments, const float* scale, int64_t n,
                     int64_t dim, int64_t lo, int64_t hi, float* out) {
  LazyRows rows(out, dim, lo, hi);
  for (int64_t i = 0; i < n; ++i) {
    const int32_t row = index[i];
    if (row < lo || row >= hi) continue;
    const float* g = grads + static_cast<int64_t>(segments[i]) * dim;
    rows.Add(row, g, scale != nullptr, scale != nullptr ? scale[i] : 1.0f);
  }
  rows.Finish();
}

// Boundaries of `parts` ranges of the u unique rows with about equal work:
// each row's update (kRowWork) plus the gradient terms summed into it, those
// counted on a sample of the entries. Zipf-hot ids come first in
// first-occurrence order, so equal row counts would leave the first part
// most of the terms. Only the speed depends on the boundaries.
std::vector<int64_t> BalancedRowRanges(const int32_t* index, int64_t n,
                                       int64_t u, int parts) {
  constexpr int64_t kBuckets = 256, kSample = 8192;
  constexpr double kRowWork = 4.0;  // two random rows vs a term's cached add
  std::vector<int64_t> bounds(parts + 1, u);
  bounds[0] = 0;
  if (u == 0) return bounds;
  std::vector<double> work(kBuckets, 0.0);
  const int64_t stride = std::max<int64_t>(1, n / kSample);
  for (int64_t i = 0; i < n; i += stride) {
    work[int64_t{index[i]} * kBuckets / u] += static_cast<double>(stride);
  }
  double total = 0.0;
  for (int64_t b = 0; b < kBuckets; ++b) {
    work[b] += kRowWork * static_cast<double>(u * (b + 1) / kBuckets -
                                              u * b / kBuckets);
    total += work[b];
  }
  double sum = 0.0;
  int part = 1;
  for (int64_t b = 0; b < kBuckets && part < parts; ++b) {
    sum += work[b];
    while (part < parts && sum >= total * part / parts) {
      bounds[part++] = u * (b + 1) / kBuckets;
    }
  }
  return bounds;
}

class RowGradientsOp : public OpKernel {
 public:
  explicit RowGradientsOp(OpKernelConstruction* ctx) : OpKernel(ctx) {}

  void Compute(OpKernelContext* ctx) override {
    const Tensor& grads_t = ctx->input(0);
    const Tensor& index_t = ctx->input(1);
    const Tensor& segments_t = ctx->input(2);
    const Tensor& scale_t = ctx->input(3);
    const int32_t num_rows = ctx->input(4).scalar<int32_t>()();
    OP_REQUIRES(ctx, grads_t.dims() == 2,
                InvalidArgument("grads must be [segments, dim]; got ",
                                grads_t.shape().DebugString()));
    OP_REQUIRES_OK(ctx, CheckBags(index_t, segments_t, scale_t));
    const int64_t n = index_t.NumElements();
    const int64_t num_segments = grads_t.dim_size(0), dim = grads_t.dim_size(1);
    const float* grads = grads_t.flat<float>().data();
    const auto index = index_t.flat<int32_t>();
    const auto segments = segments_t.flat<int32_t>();
    const float* scale = scale_t.NumElements() ? scale_t.flat<float>().data()
                                               : nullptr;
    Tensor* out_t = nullptr;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, TensorShape({num_rows, dim}),
                                             &out_t));
    float* out = out_t->flat<float>().data();
    for (int64_t i = 0; i < n; ++i) {
      const int32_t row = index(i), seg = segments(i);
      OP_REQUIRES(ctx, row >= 0 && row < num_rows && seg >= 0 &&
                           seg < num_segments,
                  InvalidArgument("index ", row, " or segment ", seg,
                                  " at position ", i, " is out of range"));
    }
    // Part k sums into the k-th range of unique rows, scanning the entries in
    // order: each row adds its terms in the one-thread order. (Only a tape on
    // the table runs this op: no automatic split.)
    const int parts = NumParts(ctx, n * dim, 0);
    auto sum_rows = [&](int part) {
      SumRowGradients(grads, index.data(), segments.data(), scale, n, dim,
                      int64_t{num_rows} * part / parts,
                      int64_t{num_rows} * (part + 1) / parts, out);
    };
    if (parts > 1) {
      RunParts(ctx, parts, sum_rows);
    } else {
      sum_rows(0);
    }
  }
};

enum class Optimizer { kSgd, kAdagrad, kAdam };

// The rows of one update: ids[r] is the table row of grads row r. `order`,
// when set, lists the `count` values of r to update (one thread's part, in
// increasing r); else r runs over [0, count).
struct Rows {
  const int64_t* ids;
  const float* grads;
  void* table;  // float, Bf16 or Half rows (UpdateRows's T)
  float* slot0;  // Adagrad accumulators, Adam momenta
  float* slot1;  // Adam velocities
  int64_t count, dim;
  const int64_t* order = nullptr;
};

// Hyper-parameters as float32, as the TF ops see them.
struct Hyper {
  float lr, gmin, gmax, wmin, wmax, decay;
  bool has_decay;
  float beta1, beta2, eps, one_minus_beta1, one_minus_beta2, eps_squared;
  bool sum_inside_sqrt;
  const Rounding* rounding;  // a narrow table's draws (nullptr for float32)
};

// Clipping, decay, the optimizer, weight clipping on each touched row, with
// one float32 operation per step of backends/optimizers.py (same rounding).
// Unclipped bounds are +-inf, so max/min leave values (and NaNs) unchanged.
// The branches are template arguments so that the row loop vectorizes.
// A narrow table (T bfloat16 or float16) reads its rows upcast and writes
// each new value with RoundTo's stochastic rounding.
template <typename T, Optimizer kOpt, bool kDecay, bool kSumInsideSqrt>
Saturated UpdateRows(const Rows& rows, const Hyper& h) {
  constexpr bool kNarrow = !std::is_same_v<T, float>;
  constexpr int32_t kLargestBits =
      std::is_same_v<T, Half> ? kLargestHalfBits : kLargestBf16Bits;
  int64_t saturated_count = 0;
  int32_t saturated_largest = 0;
  // float16 rows are upcast into `row` and written back from it, 8 values
  // at a time; the rounding between runs in float32 (RoundHalfValue).
  constexpr bool kHalf = std::is_same_v<T, Half>;
  std::vector<float> half_row(kHalf ? rows.dim : 0);
  float* const row = half_row.data();
  T* const table = static_cast<T*>(rows.table);
  const uint32_t* columns = kNarrow ? h.rounding->columns.data() : nullptr;
  constexpr int kAhead = kLookAhead;  // rows random in memory: prefetched
  const int64_t dim = rows.dim;
  const float lr = h.lr, gmin = h.gmin, gmax = h.gmax, wmin = h.wmin,
              wmax = h.wmax, decay = h.decay, beta1 = h.beta1,
              beta2 = h.beta2, eps = h.eps, omb1 = h.one_minus_beta1,
              omb2 = h.one_minus_beta2, eps2 = h.eps_squared;
  const int64_t* order = rows.order;
  for (int64_t k = 0; k < rows.count; ++k) {
    const int64_t r = order ? order[k] : k;
    if (k + kAhead < rows.count) {
      const int64_t next = rows.ids[order ? order[k + kAhead] : k + kAhead] * dim;
      PrefetchRowForWrite(table + next, dim);
      if (kOpt != Optimizer::kSgd) PrefetchRowForWrite(rows.slot0 + next, dim);
      if (kOpt == Optimizer::kAdam) PrefetchRowForWrite(rows.slot1 + next, dim);
    }
    const int64_t offset = rows.ids[r] * dim;
    T* __restrict w = table + offset;
    const uint32_t row_hash = kNarrow ? h.rounding->Row(rows.ids[r]) : 0;
    float* __restrict s0 = kOpt == Optimizer::kSgd ? nullptr : rows.slot0 + offset;
    float* __restrict s1 = kOpt == Optimizer::kAdam ? rows.slot1 + offset : nullptr;
    const float* __restrict g_row = rows.grads + r * dim;
    float* __restrict upcast = row;  // no alias: the loop vectorizes
    if constexpr (kHalf) HalfRowToFloat(w, dim, upcast);
    // The row's saturated values (narrow.saturated), in 32-bit lanes.
    int32_t row_count = 0, row_largest = 0;
    for (int64_t d = 0; d < dim; ++d) {
      const float g = std::min(std::max(g_row[d], gmin), gmax);
      float x;
      if constexpr (kHalf) {
        x = upcast[d];
      } else {
        x = ToFloat(w[d]);
      }
      if constexpr (kDecay) x = x - decay * x;
      if constexpr (kOpt == Optimizer::kSgd) {
        x = x - lr * g;
      } else if constexpr (kOpt == Optimizer::kAdagrad) {
        const float acc = s0[d] + g * g;
        s0[d] = acc;
        x = x - lr * g / std::sqrt(acc);
      } else {
        const float m = beta1 * s0[d] + omb1 * g;
        const float v = beta2 * s1[d] + omb2 * g * g;
        s0[d] = m;
        s1[d] = v;
        if constexpr (kSumInsideSqrt) {
          x = x - lr * (m / std::sqrt(v + eps2));
        } else {
          x = x - lr * (m / (std::sqrt(v) + eps));
        }
      }
      x = std::min(std::max(x, wmin), wmax);
      if constexpr (kNarrow) {
        uint32_t x_bits;
        std::memcpy(&x_bits, &x, sizeof(x_bits));
        const int32_t magnitude = static_cast<int32_t>(x_bits & 0x7FFFFFFFu);
        const bool beyond = magnitude > kLargestBits && magnitude < kInfBits;
        // A mask, not a select, into the max: GCC 12 vectorizes the loop
        // with it (a select feeding a max reduction stays scalar).
        const int32_t mask = -static_cast<int32_t>(beyond);
        row_count -= mask;
        row_largest = std::max(row_largest, magnitude & mask);
      }
      if constexpr (kHalf) {
        upcast[d] = RoundHalfValue(x, Draw(row_hash, columns[d]));
      } else if constexpr (kNarrow) {
        w[d] = RoundTo(static_cast<T*>(nullptr), x, Draw(row_hash, columns[d]));
      } else {
        w[d] = x;
      }
    }
    if constexpr (kHalf) FloatRowToHalf(upcast, dim, w);
    saturated_count += row_count;
    saturated_largest = std::max(saturated_largest, row_largest);
  }
  Saturated saturated;
  saturated.count = saturated_count;
  saturated.largest_bits = static_cast<uint32_t>(saturated_largest);
  return saturated;
}

template <typename T, Optimizer kOpt>
Saturated UpdateRows(const Rows& rows, const Hyper& h) {
  if (h.has_decay) {
    return h.sum_inside_sqrt ? UpdateRows<T, kOpt, true, true>(rows, h)
                             : UpdateRows<T, kOpt, true, false>(rows, h);
  }
  return h.sum_inside_sqrt ? UpdateRows<T, kOpt, false, true>(rows, h)
                           : UpdateRows<T, kOpt, false, false>(rows, h);
}

template <Optimizer kOpt>
Saturated UpdateRows(tensorflow::DataType dtype, const Rows& rows,
                     const Hyper& h) {
  switch (dtype) {
    case tensorflow::DT_BFLOAT16: return UpdateRows<Bf16, kOpt>(rows, h);
    case tensorflow::DT_HALF: return UpdateRows<Half, kOpt>(rows, h);
    default: return UpdateRows<float, kOpt>(rows, h);
  }
}

// Holds the exclusive locks of several variables (taken in the given order).
class ExclusiveLocks {
 public:
  explicit ExclusiveLocks(const std::vector<Var*>& vars) : vars_(vars) {
    for (Var* v : vars_) v->mu()->lock();
  }
  ~ExclusiveLocks() {
    for (auto it = vars_.rbegin(); it != vars_.rend(); ++it) (*it)->mu()->unlock();
  }

 private:
  std::vector<Var*> vars_;
};

// RecsysSparseApply (from_bags false): the optimizer step on rows `ids` with
// their gradients `grads` [U, D]. RecsysBagApply (from_bags true): the same
// after summing the rows' gradients from the bags' activation gradients, as
// RecsysRowGradients does (one op per table for the backward pass and the
// update; the [U, D] gradients stay a scratch buffer, in cache).
class SparseApplyOp : public OpKernel {
 public:
  SparseApplyOp(OpKernelConstruction* ctx, bool from_bags)
      : OpKernel(ctx), from_bags_(from_bags) {
    if (from_bags_) {
      OP_REQUIRES_OK(ctx,
                     ctx->GetAttr("concurrent_calls", &concurrent_calls_));
    }
    std::string name;
    OP_REQUIRES_OK(ctx, ctx->GetAttr("optimizer", &name));
    if (name == "sgd") {
      optimizer_ = Optimizer::kSgd; num_slots_ = 0;
    } else if (name == "adagrad") {
      optimizer_ = Optimizer::kAdagrad; num_slots_ = 1;
    } else if (name == "adam") {
      optimizer_ = Optimizer::kAdam; num_slots_ = 2;
    } else {
      ctx->CtxFailure(InvalidArgument("unknown optimizer ", name));
      return;
    }
    int slots;
    OP_REQUIRES_OK(ctx, ctx->GetAttr("num_slots", &slots));
    OP_REQUIRES(ctx, slots == num_slots_,
                InvalidArgument(name, " needs ", num_slots_, " slots; got ",
                                slots));
    for (const char* attr : {"clip_gradient_min", "clip_gradient_max",
                             "clip_weight_min", "clip_weight_max",
                             "weight_decay", "beta_1", "beta_2", "epsilon",
                             "one_minus_beta_1", "one_minus_beta_2",
                             "epsilon_squared"}) {
      float v;
      OP_REQUIRES_OK(ctx, ctx->GetAttr(attr, &v));
      hyper_.push_back(v);
    }
    OP_REQUIRES_OK(ctx, ctx->GetAttr("decay_by_lr", &decay_by_lr_));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("sum_inside_sqrt", &sum_inside_sqrt_));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("rounding_seed", &rounding_seed_));
  }

  void Compute(OpKernelContext* ctx) override {
    const int num_vars = 1 + num_slots_;
    std::vector<tsl::core::RefCountPtr<Var>> vars(num_vars);
    for (int k = 0; k < num_vars; ++k) {
      OP_REQUIRES_OK(ctx, LookupMatrix(ctx, k, k ? "slot" : "table", &vars[k],
                                       /*narrow=*/k == 0));
    }
    const Tensor& ids_t = ctx->input(num_vars);
    const Tensor& grads_t = ctx->input(num_vars + 1);
    const float lr = ctx->input(num_vars + (from_bags_ ? 5 : 2))
                         .scalar<float>()();
    const int64_t rounding_step = ctx->input(num_vars + (from_bags_ ? 6 : 3))
                                      .scalar<int64_t>()();
    OP_REQUIRES(ctx, ids_t.dims() == 1 && grads_t.dims() == 2,
                InvalidArgument("ids [U] and grads [", from_bags_ ? "S" : "U",
                                ", D] expected; got ",
                                ids_t.shape().DebugString(), " and ",
                                grads_t.shape().DebugString()));
    const int64_t u = ids_t.NumElements(), dim = grads_t.dim_size(1);
    // The bags' entries (from_bags): row index[i] gets scale[i] * grads[
    // segments[i]]; checked before any lock is taken.
    const int32_t* index = nullptr;
    const int32_t* segments = nullptr;
    const float* scale = nullptr;
    int64_t n = 0;
    if (from_bags_) {
      const Tensor& index_t = ctx->input(num_vars + 2);
      const Tensor& segments_t = ctx->input(num_vars + 3);
      const Tensor& scale_t = ctx->input(num_vars + 4);
      OP_REQUIRES_OK(ctx, CheckBags(index_t, segments_t, scale_t));
      n = index_t.NumElements();
      index = index_t.flat<int32_t>().data();
      segments = segments_t.flat<int32_t>().data();
      scale = scale_t.NumElements() ? scale_t.flat<float>().data() : nullptr;
      const int64_t num_segments = grads_t.dim_size(0);
      for (int64_t i = 0; i < n; ++i) {
        OP_REQUIRES(ctx, index[i] >= 0 && index[i] < u && segments[i] >= 0 &&
                             segments[i] < num_segments,
                    InvalidArgument("index ", index[i], " or segment ",
                                    segments[i], " at position ", i,
                                    " is out of range"));
      }
    } else {
      OP_REQUIRES(ctx, grads_t.dim_size(0) == u,
                  InvalidArgument("ids [U] and grads [U, D] expected; got ",
                                  ids_t.shape().DebugString(), " and ",
                                  grads_t.shape().DebugString()));
    }
    // Exclusive locks, in address order (no deadlock with other updates).
    std::vector<Var*> order;
    for (auto& v : vars) order.push_back(v.get());
    std::sort(order.begin(), order.end());
    order.erase(std::unique(order.begin(), order.end()), order.end());
    ExclusiveLocks locks(order);

    const Tensor& params = *vars[0]->tensor();
    const int64_t vocab = params.dim_size(0);
    for (int k = 1; k < num_vars; ++k) {
      OP_REQUIRES(ctx, vars[k]->tensor()->shape() == params.shape(),
                  InvalidArgument("slot ", k, " has shape ",
                                  vars[k]->tensor()->shape().DebugString(),
                                  ", the table ", params.shape().DebugString()));
    }
    OP_REQUIRES(ctx, dim == params.dim_size(1),
                InvalidArgument("grads have dimension ", dim, ", the table ",
                                params.shape().DebugString()));
    const auto ids = ids_t.flat<int64_t>();
    for (int64_t r = 0; r < u; ++r) {
      OP_REQUIRES(ctx, ids(r) >= 0 && ids(r) < vocab,
                  InvalidArgument("row id ", ids(r), " is outside the table's ",
                                  "rows [0, ", vocab, ")"));
    }
    Tensor row_grads_t;
    if (from_bags_) {
      OP_REQUIRES_OK(ctx, ctx->allocate_temp(tensorflow::DT_FLOAT,
                                             TensorShape({u, dim}),
                                             &row_grads_t));
    }
    const float* grads = grads_t.flat<float>().data();
    float* row_grads = from_bags_ ? row_grads_t.flat<float>().data() : nullptr;
    const tensorflow::DataType dtype = params.dtype();
    const Rounding rounding(rounding_seed_, rounding_step,
                            dtype == tensorflow::DT_FLOAT ? 0 : dim);
    Rows rows{ids.data(), from_bags_ ? row_grads : grads,
              vars[0]->tensor()->data(),
              num_slots_ > 0 ? vars[1]->tensor()->flat<float>().data() : nullptr,
              num_slots_ > 1 ? vars[2]->tensor()->flat<float>().data() : nullptr,
              u, dim};
    // As in backends/optimizers.py, 1 - beta and eps * eps come from Python
    // (computed in double before rounding to float32); d or d * lr is float32.
    Hyper h{lr, hyper_[0], hyper_[1], hyper_[2], hyper_[3],
            decay_by_lr_ ? hyper_[4] * lr : hyper_[4], hyper_[4] != 0.0f,
            hyper_[5], hyper_[6], hyper_[7], hyper_[8], hyper_[9], hyper_[10],
            sum_inside_sqrt_, &rounding};
    auto update = [this, &h, dtype](const Rows& part_rows) -> Saturated {
      switch (optimizer_) {
        case Optimizer::kSgd:
          return UpdateRows<Optimizer::kSgd>(dtype, part_rows, h);
        case Optimizer::kAdagrad:
          return UpdateRows<Optimizer::kAdagrad>(dtype, part_rows, h);
        case Optimizer::kAdam:
          return UpdateRows<Optimizer::kAdam>(dtype, part_rows, h);
      }
      return Saturated();
    };
    // Each part's saturated values, added after the parts ran (integer
    // sums and a max: the same whatever the parts).
    std::vector<Saturated> part_saturated;
    auto finish = [ctx, &part_saturated]() {
      Saturated total;
      for (const Saturated& s : part_saturated) total.Add(s);
      Tensor* count_t = nullptr;
      Tensor* largest_t = nullptr;
      OP_REQUIRES_OK(ctx, ctx->allocate_output(0, TensorShape({}), &count_t));
      OP_REQUIRES_OK(ctx,
                     ctx->allocate_output(1, TensorShape({}), &largest_t));
      count_t->scalar<int64_t>()() = total.count;
      float largest;
      std::memcpy(&largest, &total.largest_bits, sizeof(largest));
      largest_t->scalar<float>()() = largest;
    };
    if (from_bags_) {
      // Part k sums the gradients of the k-th range of unique rows (scanning
      // the entries in order: the one-thread order), then updates those rows.
      // The ids come from RecsysBagLookup, so distinct: no row is in two
      // parts, and parts need not wait for each other.
      const int parts =
          NumParts(ctx, std::max(n, u) * dim, concurrent_calls_);
      const std::vector<int64_t> bounds =
          parts > 1 ? BalancedRowRanges(index, n, u, parts)
                    : std::vector<int64_t>{0, u};
      part_saturated.resize(parts);
      auto run = [&](int part) {
        const int64_t lo = bounds[part], hi = bounds[part + 1];
        SumRowGradients(grads, index, segments, scale, n, dim, lo, hi,
                        row_grads);
        Rows mine = rows;
        mine.ids += lo;
        mine.grads += lo * dim;
        mine.count = hi - lo;
        part_saturated[part] = update(mine);
      };
      if (parts == 1) {
        run(0);
      } else {
        RunParts(ctx, parts, run);
      }
      finish();
      return;
    }
    const int parts = NumParts(ctx, u * dim, 0);
    part_saturated.resize(parts);
    if (parts == 1) {
      part_saturated[0] = update(rows);
      finish();
      return;
    }
    // Parts by table row (RowPart), each in increasing r: a row given twice
    // is updated twice, in order, by one thread, as in the one-thread loop.
    std::vector<std::vector<int64_t>> orders(parts);
    for (auto& o : orders) o.reserve(u / parts + u / (4 * parts) + 16);
    for (int64_t r = 0; r < u; ++r) orders[RowPart(ids(r), parts)].push_back(r);
    RunParts(ctx, parts, [&](int part) {
      Rows mine = rows;
      mine.order = orders[part].data();
      mine.count = static_cast<int64_t>(orders[part].size());
      part_saturated[part] = update(mine);
    });
    finish();
  }

 private:
  const bool from_bags_;
  int concurrent_calls_ = 0;
  Optimizer optimizer_;
  int num_slots_ = 0;
  std::vector<float> hyper_;
  bool decay_by_lr_ = false;
  bool sum_inside_sqrt_ = false;
  int64_t rounding_seed_ = 0;
};

class RowsApplyOp : public SparseApplyOp {
 public:
  explicit RowsApplyOp(OpKernelConstruction* ctx) : SparseApplyOp(ctx, false) {}
};

class BagApplyOp : public SparseApplyOp {
 public:
  explicit BagApplyOp(OpKernelConstruction* ctx) : SparseApplyOp(ctx, true) {}
};

// The real entries of left-aligned padded bags, in row-major order: what
// tf.where(range(W) < lengths) + gather_nd compute in four ops.
// With vocabulary_size >= 0 it also checks every real id against
// [0, vocabulary_size) and fails naming the first bad one, its batch row and
// `feature` (the Python checks' message, in one pass instead of six ops).
class PaddedBagsOp : public OpKernel {
 public:
  explicit PaddedBagsOp(OpKernelConstruction* ctx) : OpKernel(ctx) {
    OP_REQUIRES_OK(ctx, ctx->GetAttr("vocabulary_size", &vocab_));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("feature", &feature_));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("drop", &drop_));
    OP_REQUIRES(ctx, !drop_ || vocab_ >= 0,
                InvalidArgument("drop needs vocabulary_size >= 0"));
  }

  void Compute(OpKernelContext* ctx) override {
    const Tensor& ids_t = ctx->input(0);
    const Tensor& lengths_t = ctx->input(1);
    const Tensor& weights_t = ctx->input(2);
    OP_REQUIRES(ctx, ids_t.dims() == 2 && lengths_t.dims() == 1 &&
                         lengths_t.dim_size(0) == ids_t.dim_size(0),
                InvalidArgument("ids [B, W] and lengths [B] expected; got ",
                                ids_t.shape().DebugString(), " and ",
                                lengths_t.shape().DebugString()));
    const bool weighted = weights_t.NumElements() > 0;
    OP_REQUIRES(ctx, !weighted || weights_t.shape() == ids_t.shape(),
                InvalidArgument("weights must be [B, 0] or the ids' shape ",
                                ids_t.shape().DebugString(), "; got ",
                                weights_t.shape().DebugString()));
    const int64_t batch = ids_t.dim_size(0), width = ids_t.dim_size(1);
    const auto ids = ids_t.matrix<int64_t>();
    // int32 (what pad_bags gives) or int64 lengths, read without a Cast op.
    const bool lengths32 = lengths_t.dtype() == tensorflow::DT_INT32;
    const int32_t* lengths32_data =
        lengths32 ? lengths_t.flat<int32_t>().data() : nullptr;
    const int64_t* lengths64_data =
        lengths32 ? nullptr : lengths_t.flat<int64_t>().data();
    auto lengths = [&](int64_t b) -> int64_t {
      return lengths32 ? lengths32_data[b] : lengths64_data[b];
    };
    // With drop, an id outside [0, vocabulary_size) is left out (counted).
    const uint64_t vocab = static_cast<uint64_t>(vocab_);
    auto kept = [&](int64_t b, int64_t j) {
      return !drop_ || static_cast<uint64_t>(ids(b, j)) < vocab;
    };
    int64_t n = 0, cut = 0, dropped = 0;
    std::vector<int64_t> starts(batch + 1);  // bag b's first output position
    for (int64_t b = 0; b < batch; ++b) {
      const int64_t len = std::max<int64_t>(lengths(b), 0);
      const int64_t real = std::min(len, width);
      int64_t keep = real;
      if (drop_) {
        keep = 0;
        for (int64_t j = 0; j < real; ++j) keep += kept(b, j);
      }
      starts[b] = n;
      n += keep;
      dropped += real - keep;
      cut += std::max<int64_t>(len - width, 0);
    }
    starts[batch] = n;
    Tensor *values_t, *rows_t, *positions_t, *weights_out_t, *cut_t,
        *dropped_t;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, TensorShape({n}), &values_t));
    OP_REQUIRES_OK(ctx, ctx->allocate_output(1, TensorShape({n}), &rows_t));
    OP_REQUIRES_OK(ctx, ctx->allocate_output(2, TensorShape({n}), &positions_t));
    OP_REQUIRES_OK(ctx, ctx->allocate_output(
        3, TensorShape({weighted ? n : 0}), &weights_out_t));
    OP_REQUIRES_OK(ctx, ctx->allocate_output(4, TensorShape({}), &cut_t));
    OP_REQUIRES_OK(ctx, ctx->allocate_output(5, TensorShape({}), &dropped_t));
    int64_t* values = values_t->flat<int64_t>().data();
    int64_t* rows = rows_t->flat<int64_t>().data();
    int64_t* positions = positions_t->flat<int64_t>().data();
    float* weights_out = weights_out_t->flat<float>().data();
    const float* weights = weighted ? weights_t.flat<float>().data() : nullptr;
    // Part p copies the bags of the p-th range of batch rows (a pure copy:
    // the same values whichever thread writes them).
    const int parts = NumParts(ctx, 4 * n, 0);
    auto copy_bags = [&](int part) {
      const int64_t lo = batch * part / parts, hi = batch * (part + 1) / parts;
      for (int64_t b = lo; b < hi; ++b) {
        if (dropped > 0) {  // the kept entries of the bag's first min(len, W)
          const int64_t real =
              std::min(std::max<int64_t>(lengths(b), 0), width);
          for (int64_t j = 0, k = starts[b]; j < real; ++j) {
            if (!kept(b, j)) continue;
            values[k] = ids(b, j);
            rows[k] = b;
            positions[k] = j;
            if (weighted) weights_out[k] = weights[b * width + j];
            ++k;
          }
          continue;
        }
        const int64_t len = starts[b + 1] - starts[b];
        for (int64_t j = 0, k = starts[b]; j < len; ++j, ++k) {
          values[k] = ids(b, j);
          rows[k] = b;
          positions[k] = j;
          if (weighted) weights_out[k] = weights[b * width + j];
        }
      }
    };
    if (parts > 1) {
      RunParts(ctx, parts, copy_bags);
    } else {
      copy_bags(0);
    }
    cut_t->scalar<int64_t>()() = cut;
    dropped_t->scalar<int64_t>()() = dropped;
    if (vocab_ >= 0 && !drop_) {
      bool bad = false;  // one branch-free pass when every id is in range
      for (int64_t k = 0; k < n; ++k) {
        bad |= static_cast<uint64_t>(values[k]) >= static_cast<uint64_t>(vocab_);
      }
      for (int64_t k = 0; bad && k < n; ++k) {
        OP_REQUIRES(ctx, values[k] >= 0 && values[k] < vocab_,
                    InvalidArgument(feature_, " got id ", values[k],
                                    " at batch row ", rows[k],
                                    "; ids must be in [0, ", vocab_, ")."));
      }
    }
  }

 private:
  int64_t vocab_ = -1;
  std::string feature_;
  bool drop_ = false;
};

absl::Status BagLookupShape(InferenceContext* c) {
  // [num_segments (when constant), table dim (unknown here: the caller sets it)].
  tensorflow::shape_inference::DimensionHandle segments;
  TF_RETURN_IF_ERROR(c->MakeDimForScalarInput(4, &segments));
  c->set_output(0, c->Matrix(segments, c->UnknownDim()));
  c->set_output(1, c->Vector(c->UnknownDim()));
  c->set_output(2, c->Vector(c->Dim(c->input(1), 0)));
  return absl::OkStatus();
}

absl::Status RowGradientsShape(InferenceContext* c) {
  tensorflow::shape_inference::DimensionHandle rows;
  TF_RETURN_IF_ERROR(c->MakeDimForScalarInput(4, &rows));
  c->set_output(0, c->Matrix(rows, c->Dim(c->input(0), 1)));
  return absl::OkStatus();
}

}  // namespace

REGISTER_OP("RecsysBagLookup")
    .Input("table: resource")
    .Input("ids: int64")
    .Input("segments: int32")
    .Input("scale: float")
    .Input("num_segments: int32")
    .Attr("concurrent_calls: int = 0")
    .Output("activations: float")
    .Output("unique_ids: int64")
    .Output("index: int32")
    .SetIsStateful()  // reads a variable: ordered with its updates
    .SetShapeFn(BagLookupShape)
    .Doc("Sums scale * table[id] per segment; de-duplicates the ids.");

REGISTER_OP("RecsysBagSums")
    .Input("table: resource")
    .Input("ids: int64")
    .Input("segments: int32")
    .Input("scale: float")
    .Input("num_segments: int32")
    .Output("activations: float")
    .SetIsStateful()  // reads a variable: ordered with its updates
    .SetShapeFn([](InferenceContext* c) {
      tensorflow::shape_inference::DimensionHandle segments;
      TF_RETURN_IF_ERROR(c->MakeDimForScalarInput(4, &segments));
      c->set_output(0, c->Matrix(segments, c->UnknownDim()));
      return absl::OkStatus();
    })
    .Doc("Sums scale * table[id] per segment (RecsysBagLookup's sums).");

REGISTER_OP("RecsysBagDedup")
    .Input("ids: int64")
    .Attr("num_rows: int >= 0")
    .Output("unique_ids: int64")
    .Output("index: int32")
    .SetShapeFn([](InferenceContext* c) {
      c->set_output(0, c->Vector(c->UnknownDim()));
      c->set_output(1, c->Vector(c->Dim(c->input(0), 0)));
      return absl::OkStatus();
    })
    .Doc("The ids de-duplicated in first-occurrence order, and their index.");

REGISTER_OP("RecsysBuckets")
    .Input("owner: int32")
    .Input("local: int64")
    .Input("valid: bool")
    .Attr("num_shards: int >= 1")
    .Attr("capacity: int >= 0")
    .Output("slot: int32")
    .Output("send: int64")
    .Output("counts: int32")
    .SetShapeFn([](InferenceContext* c) {
      int64_t num_shards, capacity;
      TF_RETURN_IF_ERROR(c->GetAttr("num_shards", &num_shards));
      TF_RETURN_IF_ERROR(c->GetAttr("capacity", &capacity));
      c->set_output(0, c->Vector(c->Dim(c->input(0), 0)));
      c->set_output(1, c->Vector(num_shards * capacity));
      c->set_output(2, c->Vector(num_shards));
      return absl::OkStatus();
    })
    .Doc("Each id's slot in its owner's bucket, the send buffer, the counts.");

REGISTER_OP("RecsysPaddedBags")
    .Input("ids: int64")
    .Input("lengths: Tlengths")
    .Input("weights: float")
    .Output("values: int64")
    .Output("rows: int64")
    .Output("positions: int64")
    .Output("value_weights: float")
    .Output("cut: int64")
    .Output("dropped: int64")
    .Attr("Tlengths: {int32, int64} = DT_INT64")
    .Attr("vocabulary_size: int = -1")
    .Attr("feature: string = ''")
    .Attr("drop: bool = false")
    .SetShapeFn([](InferenceContext* c) {
      for (int i = 0; i < 4; ++i) c->set_output(i, c->Vector(c->UnknownDim()));
      c->set_output(4, c->Scalar());
      c->set_output(5, c->Scalar());
      return absl::OkStatus();
    })
    .Doc("The real entries of left-aligned padded bags, row-major.");

REGISTER_OP("RecsysRowGradients")
    .Input("grads: float")
    .Input("index: int32")
    .Input("segments: int32")
    .Input("scale: float")
    .Input("num_rows: int32")
    .Output("row_grads: float")
    .SetShapeFn(RowGradientsShape)
    .Doc("row_grads[index[i]] += scale[i] * grads[segments[i]].");

// RecsysSparseApply's and RecsysBagApply's outputs: the values a narrow
// table's update saturated (int64) and the largest magnitude among them
// (float32; 0 when none, and for a float32 table).
absl::Status SaturatedShape(InferenceContext* c) {
  c->set_output(0, c->Scalar());
  c->set_output(1, c->Scalar());
  return absl::OkStatus();
}

// The optimizer attributes of RecsysSparseApply and RecsysBagApply.
#define RECSYS_APPLY_ATTRS \
    .Attr("optimizer: {'sgd', 'adagrad', 'adam'}") \
    .Attr("num_slots: int >= 0") \
    .Attr("clip_gradient_min: float") \
    .Attr("clip_gradient_max: float") \
    .Attr("clip_weight_min: float") \
    .Attr("clip_weight_max: float") \
    .Attr("weight_decay: float = 0.0") \
    .Attr("decay_by_lr: bool = false") \
    .Attr("beta_1: float = 0.9") \
    .Attr("beta_2: float = 0.999") \
    .Attr("epsilon: float = 1e-8") \
    .Attr("one_minus_beta_1: float = 0.1") \
    .Attr("one_minus_beta_2: float = 0.001") \
    .Attr("epsilon_squared: float = 1e-16") \
    .Attr("sum_inside_sqrt: bool = true") \
    .Attr("rounding_seed: int = 0")

REGISTER_OP("RecsysSparseApply")
    .Input("table: resource")
    .Input("slots: num_slots * resource")
    .Input("ids: int64")
    .Input("grads: float")
    .Input("learning_rate: float")
    .Input("rounding_step: int64")
    .Output("saturated: int64")
    .Output("largest: float")
    RECSYS_APPLY_ATTRS
    .SetIsStateful()
    .SetShapeFn(SaturatedShape)
    .Doc("One TPU-semantics optimizer step on the rows ids, in place; "
         "a narrow table's saturated values counted.");

REGISTER_OP("RecsysBagApply")
    .Input("table: resource")
    .Input("slots: num_slots * resource")
    .Input("unique_ids: int64")
    .Input("grads: float")
    .Input("index: int32")
    .Input("segments: int32")
    .Input("scale: float")
    .Input("learning_rate: float")
    .Input("rounding_step: int64")
    .Attr("concurrent_calls: int = 0")
    .Output("saturated: int64")
    .Output("largest: float")
    RECSYS_APPLY_ATTRS
    .SetIsStateful()
    .SetShapeFn(SaturatedShape)
    .Doc("RecsysRowGradients, then RecsysSparseApply on unique_ids, in one op.");

REGISTER_KERNEL_BUILDER(Name("RecsysBagLookup").Device(DEVICE_CPU), BagLookupOp);
REGISTER_KERNEL_BUILDER(Name("RecsysBagSums").Device(DEVICE_CPU), BagSumsOp);
REGISTER_KERNEL_BUILDER(Name("RecsysBagDedup").Device(DEVICE_CPU), BagDedupOp);
REGISTER_KERNEL_BUILDER(Name("RecsysBuckets").Device(DEVICE_CPU), BucketsOp);
REGISTER_KERNEL_BUILDER(Name("RecsysPaddedBags").Device(DEVICE_CPU),
                        PaddedBagsOp);
REGISTER_KERNEL_BUILDER(Name("RecsysRowGradients").Device(DEVICE_CPU),
                        RowGradientsOp);
REGISTER_KERNEL_BUILDER(Name("RecsysSparseApply").Device(DEVICE_CPU),
                        RowsApplyOp);
REGISTER_KERNEL_BUILDER(Name("RecsysBagApply").Device(DEVICE_CPU), BagApplyOp);

}  // namespace recsys
