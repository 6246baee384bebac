#include "model/layer_spec.h"

namespace loom {

LayerSpec layer_spec(const ModelConfig& config) {
  LayerSpec spec;
  spec.hidden_size = config.hidden_size;
  spec.num_heads = config.num_heads;
  spec.num_kv_heads = config.num_kv_heads;
  spec.head_dim = config.head_dim;
  spec.intermediate_size = config.intermediate_size;
  spec.rms_norm_eps = config.rms_norm_eps;
  spec.qkv_bias = config.qkv_bias;
  spec.o_bias = config.o_bias;
  spec.qk_norm = config.qk_norm;
  return spec;
}

}  // namespace loom
