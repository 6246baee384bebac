#include <cctype>

#include "cli/commands.h"
#include "util/error.h"

namespace loom::cli {

LoraSpec parse_lora_spec(const std::string& spec) {
  const size_t equals = spec.find('=');
  if (equals == std::string::npos || equals == 0 || equals + 1 == spec.size())
    throw Error(ErrorKind::kInvalidArgument, "bad --lora '" + spec + "'", "use NAME=PATH[:MODE]");
  LoraSpec result{spec.substr(0, equals), spec.substr(equals + 1), "", std::nullopt};
  const size_t colon = result.path.rfind(':');
  if (colon != std::string::npos && result.path.find('/', colon) == std::string::npos) {
    result.mode = result.path.substr(colon + 1);
    result.path.resize(colon);
  }
  if (result.path.empty()) throw Error(ErrorKind::kInvalidArgument, "bad --lora '" + spec + "'", "use NAME=PATH[:MODE]");
  if (!result.mode.empty()) {
    result.sharing = parse_kv_sharing(result.mode);
    if (!result.sharing)
      throw Error(ErrorKind::kInvalidArgument, "unknown KV sharing mode '" + result.mode + "' for adapter " + result.name,
                  "use NAME=PATH[:MODE] with MODE one of isolated, activated, base, forked");
  }
  return result;
}

void add_disable_kv_sharing_option(CLI::App& app, std::vector<KvSharing>& modes) {
  app.add_option_function<std::vector<std::string>>(
         "--disable-kv-sharing",
         [&modes](const std::vector<std::string>& names) {
           modes.clear();
           for (const std::string& name : names) modes.push_back(*parse_kv_sharing(name));  // checked below
         },
         "KV sharing modes adapters may not use here, e.g. base (lossy for adapters not trained for it): "
         "MODE[,MODE]; adapters in them are refused when loaded, like modes the backend lacks")
      ->delimiter(',')
      ->check(CLI::IsMember({"isolated", "activated", "base", "forked"}));
}

int64_t parse_byte_size(const std::string& text, const std::string& flag) {
  const auto bad = [&] {
    throw Error(ErrorKind::kInvalidArgument, "bad " + flag + " '" + text + "'", "give bytes, e.g. 4096, 512K, 64M, 2G");
  };
  size_t digits = 0;
  while (digits < text.size() && std::isdigit(static_cast<unsigned char>(text[digits]))) ++digits;
  if (digits == 0 || digits > 12) bad();
  int64_t value = std::stoll(text.substr(0, digits));
  std::string unit = text.substr(digits);
  for (char& c : unit) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  if (unit.size() > 1 && unit.back() == 'B') unit.pop_back();
  if (unit.size() > 1 && unit.back() == 'I') unit.pop_back();
  const std::string units = "KMGT";
  if (unit.empty() || unit == "B") return value;
  const size_t power = units.find(unit);
  if (unit.size() != 1 || power == std::string::npos) bad();
  for (size_t i = 0; i <= power; ++i) value *= 1024;
  return value;
}

CLI::Validator byte_size_transform() {
  return CLI::Validator(
      [](std::string& text) -> std::string {
        try {
          text = std::to_string(parse_byte_size(text, "size"));
          return {};
        } catch (const Error& error) {
          return error.what();
        }
      },
      "BYTES");
}

namespace {

CLI::Validator throwing_byte_size_transform(const std::string& flag, bool accept_auto) {
  return CLI::Validator(
      [flag, accept_auto](std::string& text) -> std::string {
        text = accept_auto && text == "auto" ? "-1" : std::to_string(parse_byte_size(text, flag));
        return {};
      },
      accept_auto ? "BYTES|auto" : "BYTES");
}

}  // namespace

CLI::Validator byte_size_transform(const std::string& flag) { return throwing_byte_size_transform(flag, false); }

CLI::Validator byte_size_or_auto_transform(const std::string& flag) { return throwing_byte_size_transform(flag, true); }

}  // namespace loom::cli
