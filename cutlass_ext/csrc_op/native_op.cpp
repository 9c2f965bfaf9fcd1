// humming_triton::quant_linear_native / grouped_linear_native: the planned quantized linear (and MoE experts'
// grouped linear) with its per-call host path in C++ (issue 14).
//
// Why: under torch.compile a quantized linear is an opaque custom op, and each call paid the dispatcher's boxing of
// 13 arguments into Python plus our Python body (plan lookup, output, ctypes launch) -- the compiled decode step
// ran at 0.73x bf16's (benchmarks/results/h200/ANALYSIS.md, session 17).  Here the op's kernel is C++: a hit finds
// the plan the Python path left for this weight and call signature, checks that nothing it was made from changed
// (each weight tensor is the same object at the same version counter, x has the planned shape / dtype / device /
// layout, the bias matches), allocates the output and launches the native decode kernel with a patched copy of the
// prepared HtDecodeCall.  Anything else -- first call, an edited weight, another layout -- calls the Python op
// humming_triton::_quant_linear_native_miss (the full path, which leaves a plan for next time): same answer,
// Python's cost.  The grouped op is the same with the experts' row offsets (a device tensor, patched into the
// launch like x) and its own miss op.  The launch struct is opaque here: Python passes its bytes, where x / y /
// stream / bias / offsets sit in it, and the library's entry points (cutlass_ext/native_op.py).
#include <ATen/core/Tensor.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/ops/empty.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>
#include <c10/util/intrusive_ptr.h>
#include <torch/library.h>

#include <array>
#include <atomic>
#include <cstring>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

namespace {

using at::Tensor;
using OptT = std::optional<Tensor>;
constexpr int kWeightTensors = 7;  // data, scales, zeros, global_scale, input_scale, wbias, k_perm
constexpr size_t kMaxCall = 1024;  // bytes of a launch struct (HtDecodeCall is ~200)
constexpr size_t kMaxPlans = 4096;

using Launch = int (*)(const void*);
using ErrorString = const char* (*)(int);

int64_t version_of(const Tensor& t) { return t.is_inference() ? -2 : static_cast<int64_t>(t._version()); }

struct Watched {  // one weight tensor as the plan saw it; weak: a plan never keeps a dropped weight alive
  std::optional<c10::weak_intrusive_ptr<c10::TensorImpl>> impl;  // empty: the argument was None
  int64_t version = 0;
  const void* ptr = nullptr;  // its memory: ``t.data = other`` keeps the TensorImpl and the version, not this

  bool alive() const { return !impl || !impl->expired(); }
  bool matches(const OptT& t) const {
    const bool has = t.has_value() && t->defined();
    if (has != impl.has_value()) return false;
    if (!has) return true;
    auto held = impl->lock();
    return held && held.get() == t->unsafeGetTensorImpl() && version_of(*t) == version && t->data_ptr() == ptr;
  }
};

struct Plan {
  std::array<Watched, kWeightTensors> weight;
  std::string scheme, backend;
  std::vector<int64_t> x_sizes, shape, out_sizes;
  at::ScalarType x_dtype, y_dtype;
  int64_t out_dtype;  // -1: None
  int64_t device_index;
  at::DeviceType device_type;
  bool has_bias;
  at::ScalarType bias_dtype;
  std::vector<int64_t> bias_sizes;
  bool weight_bias;  // without a bias argument, the launch reads the weight's own bias (wbias), patched per call
  bool grouped;  // grouped_linear_native's plan: takes the experts' row offsets
  at::ScalarType offsets_dtype;
  int64_t offsets_numel;
  std::vector<uint8_t> call;
  size_t off_x, off_y, off_stream, off_bias, off_offsets;
  Launch launch;
  ErrorString error_string;
  std::vector<Tensor> keep;  // what the call points into (the kernel's repacked weight)
  int64_t epoch;
};

// The table, by the weight's data tensor.  Plans are shared and const: a hit copies the pointer under the lock and
// runs without it (the output's allocation and the launch may end up in Python, e.g. a collector freeing a weight
// whose finalizer sweeps this table), and erased plans are destroyed after the lock is released for the same reason.
using PlanPtr = std::shared_ptr<const Plan>;
std::mutex g_mutex;
std::unordered_multimap<const c10::TensorImpl*, PlanPtr> g_plans;
std::atomic<int64_t> g_epoch{0};  // bumped when dispatch's state changes: every plan made before is void
std::atomic<int64_t> g_hits{0}, g_misses{0};

std::array<const OptT*, kWeightTensors> weight_refs(const OptT& data, const OptT& scales, const OptT& zeros,
                                                    const OptT& gs, const OptT& is, const OptT& wbias, const OptT& kp) {
  return {&data, &scales, &zeros, &gs, &is, &wbias, &kp};
}

// offsets: nullptr for quant_linear_native's call, the offsets argument for grouped_linear_native's
bool plan_fits(const Plan& p, const Tensor& x, const std::array<const OptT*, kWeightTensors>& w,
               c10::string_view scheme, c10::IntArrayRef shape, const Tensor* offsets, const OptT& bias,
               c10::string_view backend, std::optional<at::ScalarType> out_dtype) {
  if (p.epoch != g_epoch.load(std::memory_order_relaxed)) return false;
  if (p.grouped != (offsets != nullptr)) return false;
  if (offsets && (offsets->scalar_type() != p.offsets_dtype || offsets->dim() != 1 ||
                  offsets->numel() != p.offsets_numel || offsets->device() != x.device() || !offsets->is_contiguous()))
    return false;
  if (x.scalar_type() != p.x_dtype || x.device().type() != p.device_type || x.device().index() != p.device_index)
    return false;
  if (x.sizes() != c10::IntArrayRef(p.x_sizes) || shape != c10::IntArrayRef(p.shape)) return false;
  if ((out_dtype ? static_cast<int64_t>(*out_dtype) : -1) != p.out_dtype) return false;
  if (backend != c10::string_view(p.backend) || scheme != c10::string_view(p.scheme)) return false;
  const bool has_bias = bias.has_value() && bias->defined();
  if (has_bias != p.has_bias) return false;
  if (has_bias && (bias->scalar_type() != p.bias_dtype || bias->device() != x.device() || !bias->is_contiguous() ||
                   bias->sizes() != c10::IntArrayRef(p.bias_sizes)))
    return false;
  for (int i = 0; i < kWeightTensors; ++i)
    if (!p.weight[i].matches(*w[i])) return false;
  return true;
}

// The plan's launch on x; false (nothing launched) where x's memory is not what the kernel reads directly.
bool run_plan(const Plan& p, const Tensor& x, const Tensor* offsets, const OptT& bias, const OptT& wbias, Tensor& y) {
  if (!x.is_contiguous() || reinterpret_cast<uintptr_t>(x.data_ptr()) % 16) return false;
  y = at::empty(p.out_sizes, x.options().dtype(p.y_dtype));
  alignas(16) uint8_t call[kMaxCall];
  std::memcpy(call, p.call.data(), p.call.size());
  void* xp = x.data_ptr();
  void* yp = y.data_ptr();
  void* stream = nullptr;
  if (p.device_type != at::kCPU)  // CPU plans exist only in tests (a host function as the launch)
    stream = c10::impl::getDeviceGuardImpl(p.device_type)->getStream(x.device()).native_handle();
  std::memcpy(call + p.off_x, &xp, sizeof(void*));
  std::memcpy(call + p.off_y, &yp, sizeof(void*));
  std::memcpy(call + p.off_stream, &stream, sizeof(void*));
  if (p.has_bias || p.weight_bias) {  // the weight's own: plan_fits matched its tensor, version and memory
    void* bp = p.has_bias ? bias->data_ptr() : wbias->data_ptr();
    std::memcpy(call + p.off_bias, &bp, sizeof(void*));
  }
  if (p.grouped) {
    void* op = offsets->data_ptr();
    std::memcpy(call + p.off_offsets, &op, sizeof(void*));
  }
  const int err = p.launch(call);
  TORCH_CHECK(err == 0, "the native ", p.grouped ? "grouped " : "", "decode kernel failed: error ", err, " (",
              p.error_string ? p.error_string(err) : "?", ")");
  return true;
}

// The plan for this call if one fits, else null; only the lookup runs under the lock (see PlanPtr).
PlanPtr find_plan(const Tensor& x, const Tensor& data, const Tensor& scales, const OptT& zeros, const OptT& gs,
                  const OptT& is, const OptT& wbias, const OptT& kp, c10::string_view scheme, c10::IntArrayRef shape,
                  const Tensor* offsets, const OptT& bias, c10::string_view backend,
                  std::optional<at::ScalarType> out_dtype) {
  const OptT data_opt(data), scales_opt(scales);
  const auto w = weight_refs(data_opt, scales_opt, zeros, gs, is, wbias, kp);
  std::lock_guard<std::mutex> lock(g_mutex);
  auto range = g_plans.equal_range(data.unsafeGetTensorImpl());
  for (auto it = range.first; it != range.second; ++it)
    if (plan_fits(*it->second, x, w, scheme, shape, offsets, bias, backend, out_dtype)) return it->second;
  return nullptr;
}

Tensor quant_linear_native(const Tensor& x, const Tensor& data, const Tensor& scales, const OptT& zeros,
                           const OptT& gs, const OptT& is, const OptT& wbias, const OptT& kp, c10::string_view scheme,
                           c10::IntArrayRef shape, const OptT& bias, c10::string_view backend,
                           std::optional<at::ScalarType> out_dtype) {
  PlanPtr plan = find_plan(x, data, scales, zeros, gs, is, wbias, kp, scheme, shape, nullptr, bias, backend, out_dtype);
  Tensor y;
  if (plan && run_plan(*plan, x, nullptr, bias, wbias, y)) {
    ++g_hits;
    return y;
  }
  ++g_misses;
  static auto miss = c10::Dispatcher::singleton()
                         .findSchemaOrThrow("humming_triton::_quant_linear_native_miss", "")
                         .typed<Tensor(const Tensor&, const Tensor&, const Tensor&, const OptT&, const OptT&,
                                       const OptT&, const OptT&, const OptT&, c10::string_view, c10::IntArrayRef,
                                       const OptT&, c10::string_view, std::optional<at::ScalarType>)>();
  return miss.call(x, data, scales, zeros, gs, is, wbias, kp, scheme, shape, bias, backend, out_dtype);
}

Tensor grouped_linear_native(const Tensor& x, const Tensor& data, const Tensor& scales, const OptT& zeros,
                             const OptT& gs, const OptT& is, const OptT& wbias, const OptT& kp,
                             c10::string_view scheme, c10::IntArrayRef shape, const Tensor& offsets, const OptT& bias,
                             c10::string_view backend, std::optional<at::ScalarType> out_dtype) {
  PlanPtr plan = find_plan(x, data, scales, zeros, gs, is, wbias, kp, scheme, shape, &offsets, bias, backend,
                           out_dtype);
  Tensor y;
  if (plan && run_plan(*plan, x, &offsets, bias, wbias, y)) {
    ++g_hits;
    return y;
  }
  ++g_misses;
  static auto miss = c10::Dispatcher::singleton()
                         .findSchemaOrThrow("humming_triton::_grouped_linear_native_miss", "")
                         .typed<Tensor(const Tensor&, const Tensor&, const Tensor&, const OptT&, const OptT&,
                                       const OptT&, const OptT&, const OptT&, c10::string_view, c10::IntArrayRef,
                                       const Tensor&, const OptT&, c10::string_view,
                                       std::optional<at::ScalarType>)>();
  return miss.call(x, data, scales, zeros, gs, is, wbias, kp, scheme, shape, offsets, bias, backend, out_dtype);
}

// Python (cutlass_ext/native_op.py) hands over the plan its full path just made for this signature.
// ``offsets``: the grouped call's row offsets, None for a quant_linear plan.
void plan_add(const Tensor& x, const Tensor& data, const Tensor& scales, const OptT& zeros, const OptT& gs,
              const OptT& is, const OptT& wbias, const OptT& kp, c10::string_view scheme, c10::IntArrayRef shape,
              const OptT& offsets, const OptT& bias, c10::string_view backend, std::optional<at::ScalarType> out_dtype,
              const Tensor& call, int64_t launch, int64_t error_string, c10::IntArrayRef fields,
              c10::IntArrayRef out_sizes, at::ScalarType y_dtype, at::TensorList keep, bool weight_bias,
              int64_t epoch) {
  TORCH_CHECK(call.device().is_cpu() && call.scalar_type() == at::kByte && call.is_contiguous() &&
                  static_cast<size_t>(call.numel()) <= kMaxCall,
              "plan_add: the launch struct must be a contiguous CPU uint8 tensor of at most ", kMaxCall, " bytes");
  TORCH_CHECK(fields.size() == 5, "plan_add: fields are the offsets of (x, y, stream, bias, row offsets)");
  const bool grouped = offsets.has_value() && offsets->defined();
  for (size_t i = 0; i < fields.size(); ++i) {
    const int64_t o = fields[i];
    if (i == 4 && !grouped) {
      TORCH_CHECK(o == -1, "plan_add: a quant_linear plan has no row offsets field (-1), got ", o);
      continue;
    }
    TORCH_CHECK(o >= 0 && static_cast<size_t>(o) + sizeof(void*) <= static_cast<size_t>(call.numel()),
                "plan_add: field offset ", o, " outside the ", call.numel(), "-byte launch struct");
  }
  TORCH_CHECK(launch != 0, "plan_add: no launch function");
  auto owned = std::make_shared<Plan>();
  Plan& p = *owned;
  const OptT data_opt(data), scales_opt(scales);
  const auto w = weight_refs(data_opt, scales_opt, zeros, gs, is, wbias, kp);
  for (int i = 0; i < kWeightTensors; ++i) {
    const OptT& t = *w[i];
    // an inference tensor has no version counter: an edit of it (in inference mode) could not void the plan
    if (t.has_value() && t->defined() && t->is_inference()) return;
    if (t.has_value() && t->defined()) {
      p.weight[i].impl.emplace(t->getIntrusivePtr());
      p.weight[i].version = version_of(*t);
      p.weight[i].ptr = t->data_ptr();
    }
  }
  p.scheme = std::string(scheme);
  p.backend = std::string(backend);
  p.x_sizes = x.sizes().vec();
  p.shape = shape.vec();
  p.out_sizes = out_sizes.vec();
  p.x_dtype = x.scalar_type();
  p.y_dtype = y_dtype;
  p.out_dtype = out_dtype ? static_cast<int64_t>(*out_dtype) : -1;
  p.device_type = x.device().type();
  p.device_index = x.device().index();
  p.has_bias = bias.has_value() && bias->defined();
  p.bias_dtype = p.has_bias ? bias->scalar_type() : at::kFloat;
  if (p.has_bias) p.bias_sizes = bias->sizes().vec();
  p.weight_bias = weight_bias && !p.has_bias;
  TORCH_CHECK(!p.weight_bias || (wbias.has_value() && wbias->defined()),
              "plan_add: the launch reads the weight's bias, but the weight has none");
  p.grouped = grouped;
  p.offsets_dtype = grouped ? offsets->scalar_type() : at::kInt;
  p.offsets_numel = grouped ? offsets->numel() : 0;
  const auto* bytes = call.data_ptr<uint8_t>();
  p.call.assign(bytes, bytes + call.numel());
  p.off_x = fields[0], p.off_y = fields[1], p.off_stream = fields[2], p.off_bias = fields[3];
  p.off_offsets = grouped ? fields[4] : 0;
  p.launch = reinterpret_cast<Launch>(launch);
  p.error_string = reinterpret_cast<ErrorString>(error_string);
  p.keep = keep.vec();
  p.epoch = epoch;
  std::vector<PlanPtr> dropped;  // destroyed after the lock is released (see PlanPtr)
  std::lock_guard<std::mutex> lock(g_mutex);
  if (epoch != g_epoch.load()) return;  // made under a state that has changed since
  // drop plans of dead weights or of this exact signature (one plan per signature), bound the table
  for (auto it = g_plans.begin(); it != g_plans.end();) {
    const Plan& o = *it->second;
    const bool dead = !o.weight[0].alive();
    const bool same = it->first == data.unsafeGetTensorImpl() && o.x_sizes == p.x_sizes && o.x_dtype == p.x_dtype &&
                      o.device_type == p.device_type && o.device_index == p.device_index &&
                      o.out_dtype == p.out_dtype && o.has_bias == p.has_bias && o.bias_dtype == p.bias_dtype &&
                      o.bias_sizes == p.bias_sizes && o.weight_bias == p.weight_bias && o.backend == p.backend &&
                      o.grouped == p.grouped &&
                      o.offsets_dtype == p.offsets_dtype && o.offsets_numel == p.offsets_numel;
    if (dead || same) {
      dropped.push_back(std::move(it->second));
      it = g_plans.erase(it);
    } else {
      ++it;
    }
  }
  if (g_plans.size() >= kMaxPlans) {
    for (auto& kv : g_plans) dropped.push_back(std::move(kv.second));
    g_plans.clear();
  }
  g_plans.emplace(data.unsafeGetTensorImpl(), std::move(owned));
}

// Every plan made so far is void (dispatch's table, a posed device or batch-invariant mode changed); returns the
// new epoch, which plans made from now on carry.
int64_t plans_reset() {
  std::vector<PlanPtr> dropped;
  std::lock_guard<std::mutex> lock(g_mutex);
  for (auto& kv : g_plans) dropped.push_back(std::move(kv.second));
  g_plans.clear();
  return ++g_epoch;
}

// Drops the plans of one weight (its data tensor's TensorImpl address, ``Tensor._cdata``): Python calls it as that
// tensor is collected -- from a weak reference's callback, which runs before the TensorImpl is released, so a
// sweep for expired weights would still find it alive.  The plans' weak references keep the address from being
// reused until they are gone.
int64_t plans_drop(int64_t impl) {
  std::vector<PlanPtr> dropped;
  std::lock_guard<std::mutex> lock(g_mutex);
  auto range = g_plans.equal_range(reinterpret_cast<const c10::TensorImpl*>(impl));
  for (auto it = range.first; it != range.second; ++it) dropped.push_back(std::move(it->second));
  g_plans.erase(range.first, range.second);
  return static_cast<int64_t>(dropped.size());
}

// The epoch a plan made from now on must carry (read before the Python path plans: a reset in between voids it).
int64_t plans_epoch() { return g_epoch.load(); }

// Hits and misses of quant_linear_native and grouped_linear_native since the process started.
std::vector<int64_t> plans_stats() { return {g_hits.load(), g_misses.load()}; }

int64_t plans_count() {
  std::lock_guard<std::mutex> lock(g_mutex);
  return static_cast<int64_t>(g_plans.size());
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(humming_triton, m) {
  m.def(
      "_native_plan_add(Tensor x, Tensor data, Tensor scales, Tensor? zeros, Tensor? global_scale, "
      "Tensor? input_scale, Tensor? wbias, Tensor? k_perm, str scheme, int[] shape, Tensor? offsets, Tensor? bias, "
      "str backend, ScalarType? out_dtype, Tensor call, int launch, int error_string, int[] fields, int[] out_sizes, "
      "ScalarType y_dtype, Tensor[] keep, bool weight_bias, int epoch) -> ()");
  m.def("_native_plans_reset() -> int");
  m.def("_native_plans_count() -> int");
  m.def("_native_plans_epoch() -> int");
  m.def("_native_plans_drop(int impl) -> int");
  m.def("_native_plans_stats() -> int[]");
  m.impl("_native_plan_add", c10::DispatchKey::CompositeExplicitAutograd, TORCH_FN(plan_add));
  m.impl("_native_plans_reset", c10::DispatchKey::CompositeExplicitAutograd, TORCH_FN(plans_reset));
  m.impl("_native_plans_count", c10::DispatchKey::CompositeExplicitAutograd, TORCH_FN(plans_count));
  m.impl("_native_plans_epoch", c10::DispatchKey::CompositeExplicitAutograd, TORCH_FN(plans_epoch));
  m.impl("_native_plans_drop", c10::DispatchKey::CompositeExplicitAutograd, TORCH_FN(plans_drop));
  m.impl("_native_plans_stats", c10::DispatchKey::CompositeExplicitAutograd, TORCH_FN(plans_stats));
}

TORCH_LIBRARY_IMPL(humming_triton, CUDA, m) {
  m.impl("quant_linear_native", TORCH_FN(quant_linear_native));
  m.impl("grouped_linear_native", TORCH_FN(grouped_linear_native));
}
TORCH_LIBRARY_IMPL(humming_triton, CPU, m) {
  m.impl("quant_linear_native", TORCH_FN(quant_linear_native));
  m.impl("grouped_linear_native", TORCH_FN(grouped_linear_native));
}
