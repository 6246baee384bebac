#include "server/http_types.h"

#include <boost/beast/core/string.hpp>

namespace loom::server {

std::string_view HttpRequest::header(std::string_view name) const {
  for (const auto& [key, value] : headers)
    if (boost::beast::iequals(key, boost::beast::string_view(name.data(), name.size()))) return value;
  return {};
}

}  // namespace loom::server
