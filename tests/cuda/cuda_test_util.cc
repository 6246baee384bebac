#include "cuda_test_util.h"

#include <algorithm>
#include <cmath>

#include <cuda_runtime_api.h>
#include <fmt/format.h>

#include "backend/cuda/cuda_check.h"
#include "backend/cuda/plan_types.h"
#include "util/half.h"

namespace loom::cuda::test {

bool has_hopper_gpu() {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess || count == 0) {
    cudaGetLastError();
    return false;
  }
  int major = 0;
  cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, 0);
  return major >= 9;
}

int visible_gpus() {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess) {
    cudaGetLastError();
    return 0;
  }
  return count;
}

float round_to_bf16(float value) { return bf16_to_float(float_to_bf16(value)); }

std::vector<float> round_to_bf16(std::vector<float> values) {
  for (float& v : values) v = round_to_bf16(v);
  return values;
}

std::vector<float> random_values(Prng& prng, size_t count, float scale, bool bf16) {
  std::vector<float> values(count);
  for (float& v : values) {
    v = prng.next_symmetric_float() * scale;
    if (bf16) v = round_to_bf16(v);
  }
  return values;
}

DeviceBuffer upload_bf16(const std::vector<float>& values) {
  std::vector<uint16_t> bits(values.size());
  for (size_t i = 0; i < values.size(); ++i) bits[i] = float_to_bf16(values[i]);
  return upload(bits);
}

DeviceBuffer upload_f32(const std::vector<float>& values) { return upload(values); }

template <typename T>
DeviceBuffer upload(const std::vector<T>& values) {
  DeviceBuffer buffer(std::max<size_t>(values.size(), 1) * sizeof(T));
  if (!values.empty())
    LOOM_CUDA_CHECK(cudaMemcpy(buffer.data(), values.data(), values.size() * sizeof(T), cudaMemcpyHostToDevice));
  return buffer;
}
template DeviceBuffer upload(const std::vector<int32_t>&);
template DeviceBuffer upload(const std::vector<uint16_t>&);
template DeviceBuffer upload(const std::vector<uint8_t>&);
template DeviceBuffer upload(const std::vector<float>&);
template DeviceBuffer upload(const std::vector<LoraModuleRef>&);

std::vector<float> download_bf16(const void* device, size_t count) {
  std::vector<uint16_t> bits(count);
  LOOM_CUDA_CHECK(cudaDeviceSynchronize());
  LOOM_CUDA_CHECK(cudaMemcpy(bits.data(), device, count * sizeof(uint16_t), cudaMemcpyDeviceToHost));
  std::vector<float> values(count);
  for (size_t i = 0; i < count; ++i) values[i] = bf16_to_float(bits[i]);
  return values;
}

std::vector<float> download_f32(const void* device, size_t count) {
  std::vector<float> values(count);
  LOOM_CUDA_CHECK(cudaDeviceSynchronize());
  LOOM_CUDA_CHECK(cudaMemcpy(values.data(), device, count * sizeof(float), cudaMemcpyDeviceToHost));
  return values;
}

std::string Closeness::describe() const {
  return fmt::format("nmse {:.3g}, max |err| {:.3g}, {} outside tolerance (first at {}){}", nmse, max_abs_error,
                     num_outside, first_outside, has_nan ? ", NaN present" : "");
}

Closeness compare(const std::vector<float>& out, const std::vector<float>& ref, double rtol, double atol) {
  Closeness result;
  double error_sum = 0.0, ref_sum = 0.0;
  for (size_t i = 0; i < ref.size() && i < out.size(); ++i) {
    if (std::isnan(out[i]) || std::isinf(out[i])) result.has_nan = true;
    const double diff = static_cast<double>(out[i]) - ref[i];
    error_sum += diff * diff;
    ref_sum += static_cast<double>(ref[i]) * ref[i];
    result.max_abs_error = std::max(result.max_abs_error, std::fabs(diff));
    if (!(std::fabs(diff) <= atol + rtol * std::fabs(ref[i]))) {
      if (result.num_outside == 0) result.first_outside = i;
      ++result.num_outside;
    }
  }
  result.nmse = ref_sum > 0 ? error_sum / ref_sum : error_sum;
  if (out.size() != ref.size()) result.has_nan = true;
  return result;
}

::testing::AssertionResult close_bf16(const std::vector<float>& out, const std::vector<float>& ref,
                                      bool long_reduction) {
  const Closeness c = compare(out, ref);
  if (out.size() != ref.size())
    return ::testing::AssertionFailure() << "size " << out.size() << " vs reference " << ref.size();
  if (c.has_nan) return ::testing::AssertionFailure() << c.describe();
  if (c.num_outside == 0) return ::testing::AssertionSuccess() << c.describe();
  if (long_reduction && c.nmse <= 1e-4) return ::testing::AssertionSuccess() << c.describe();
  return ::testing::AssertionFailure() << c.describe() << "; out[" << c.first_outside << "] = " << out[c.first_outside]
                                       << ", ref = " << ref[c.first_outside];
}

std::vector<float> kv_pool_device_layout(const std::vector<float>& pool, int64_t num_slots, int32_t num_kv_heads,
                                         int32_t head_dim, int32_t block_size) {
  std::vector<float> out(pool.size());
  const int64_t kv_size = static_cast<int64_t>(num_kv_heads) * head_dim;
  for (int64_t slot = 0; slot < num_slots; ++slot)
    for (int32_t h = 0; h < num_kv_heads; ++h)
      std::copy_n(pool.begin() + slot * kv_size + h * head_dim, head_dim,
                  out.begin() + kv_element_index(slot, h, block_size, num_kv_heads, head_dim));
  return out;
}

AttentionParams plan_attention_params(const StepPlan& plan, const int32_t* plan_words, int32_t num_heads,
                                      int32_t num_kv_heads, int32_t head_dim, int32_t block_size) {
  AttentionParams params;
  params.block_tables = plan_words + plan.sections().block_tables;
  params.sequences = reinterpret_cast<const AttentionSequence*>(plan_words + plan.sections().sequences);
  params.num_heads = num_heads;
  params.num_kv_heads = num_kv_heads;
  params.head_dim = head_dim;
  params.block_size = block_size;
  params.scale = 1.0f / std::sqrt(static_cast<float>(head_dim));
  return params;
}

}  // namespace loom::cuda::test
