#include "cli/commands.h"
#include "util/error.h"

namespace loom::cli {

LoraSpec parse_lora_spec(const std::string& spec) {
  const size_t equals = spec.find('=');
  if (equals == std::string::npos || equals == 0 || equals + 1 == spec.size())
    throw Error(ErrorKind::kInvalidArgument, "bad --lora '" + spec + "'", "use NAME=PATH[:MODE]");
  LoraSpec result{spec.substr(0, equals), spec.substr(equals + 1), ""};
  const size_t colon = result.path.rfind(':');
  if (colon != std::string::npos && result.path.find('/', colon) == std::string::npos) {
    result.mode = result.path.substr(colon + 1);
    result.path.resize(colon);
  }
  if (!result.mode.empty() && result.mode != "isolated")
    throw Error(ErrorKind::kUnsupported, "sharing mode '" + result.mode + "' for adapter " + result.name,
                "only 'isolated' is implemented in this version");
  return result;
}

}  // namespace loom::cli
