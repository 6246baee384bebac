#include "engine/generation_result.h"

namespace loom {

const char* finish_reason_name(FinishReason reason) {
  return reason == FinishReason::kStop ? "stop" : "length";
}

}  // namespace loom
