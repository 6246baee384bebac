#include <filesystem>
#include <fstream>
#include <sstream>

#include "chat/chat_renderer.h"
#include "util/error.h"

namespace loom {

std::string load_chat_template_argument(const std::string& argument) {
  std::error_code error;
  if (std::filesystem::is_regular_file(argument, error)) {
    std::ifstream file(argument, std::ios::binary);
    std::stringstream buffer;
    buffer << file.rdbuf();
    if (!file.fail() || file.eof()) return buffer.str();
    fail(ErrorKind::kNotFound, "--chat-template {}: cannot read the file", argument);
  }
  if (argument.find_first_of("{}\n") == std::string::npos)
    throw Error(ErrorKind::kNotFound, "--chat-template " + argument + ": no such file",
                "give a path to a Jinja file, or the template text itself");
  std::string text;
  for (size_t i = 0; i < argument.size(); ++i) {
    if (argument[i] != '\\' || i + 1 == argument.size()) {
      text.push_back(argument[i]);
      continue;
    }
    switch (argument[++i]) {
      case 'n': text.push_back('\n'); break;
      case 't': text.push_back('\t'); break;
      case 'r': text.push_back('\r'); break;
      case '\\': text.push_back('\\'); break;
      default: text.push_back('\\'); text.push_back(argument[i]); break;
    }
  }
  return text;
}

}  // namespace loom
