#include "grammar/string_formats.h"

#include <map>

namespace loom::grammar {
namespace {

const std::string kHex = "[0-9a-fA-F]";
const std::string kHexGroup = kHex + "{1,4}";

std::string ipv6() {
  const std::string g = kHexGroup;
  return "(" + g + ":){7}" + g + "|(" + g + ":){1,7}:|(" + g + ":){1,6}:" + g + "|(" + g + ":){1,5}(:" + g +
         "){1,2}|(" + g + ":){1,4}(:" + g + "){1,3}|(" + g + ":){1,3}(:" + g + "){1,4}|(" + g + ":){1,2}(:" + g +
         "){1,5}|" + g + ":(:" + g + "){1,6}|:((:" + g + "){1,7}|:)";
}

// RFC 3986, section 3: the generic syntax, without its IPvFuture literal.
struct UriParts {
  std::string unreserved_or_sub_delims = R"(A-Za-z0-9\-._~!\$&'\(\)\*\+,;=)";
  std::string pct = "%" + kHex + "{2}";
  std::string pchar = "([" + unreserved_or_sub_delims + ":@]|" + pct + ")";
  std::string authority = "(([" + unreserved_or_sub_delims + ":]|" + pct + ")*@)?(\\[(" + ipv6() + ")\\]|([" +
                          unreserved_or_sub_delims + "]|" + pct + ")*)(:[0-9]*)?";
  std::string path_abempty = "(/" + pchar + "*)*";
  std::string path_absolute = "/(" + pchar + "+" + path_abempty + ")?";
  std::string query_and_fragment = "(\\?([" + unreserved_or_sub_delims + ":@/\\?]|" + pct + ")*)?(#([" +
                                   unreserved_or_sub_delims + ":@/\\?]|" + pct + ")*)?";
  std::string segment_without_colon = "([" + unreserved_or_sub_delims + "@]|" + pct + ")+";

  std::string uri() const {
    return "[a-zA-Z][a-zA-Z0-9+.\\-]*:(//" + authority + path_abempty + "|" + path_absolute + "|" + pchar + "+" +
           path_abempty + ")?" + query_and_fragment;
  }
  std::string relative_reference() const {
    return "(//" + authority + path_abempty + "|" + path_absolute + "|" + segment_without_colon + path_abempty + ")?" +
           query_and_fragment;
  }
};

std::string duration() {
  const std::string seconds = "[0-9]+(\\.[0-9]+)?S";
  const std::string time = "T([0-9]+H([0-9]+M)?(" + seconds + ")?|[0-9]+M(" + seconds + ")?|" + seconds + ")";
  return "P([0-9]+W|[0-9]+Y([0-9]+M)?([0-9]+D)?(" + time + ")?|[0-9]+M([0-9]+D)?(" + time + ")?|[0-9]+D(" + time +
         ")?|" + time + ")";
}

std::map<std::string, StringFormat, std::less<>> build_formats() {
  const std::string date = R"(\d{4}-(0[1-9]|1[0-2])-(0[1-9]|[12]\d|3[01]))";
  const std::string time = R"(([01]\d|2[0-3]):[0-5]\d:([0-5]\d|60)(\.\d+)?([Zz]|[+-]([01]\d|2[0-3]):[0-5]\d))";
  const std::string label = "[a-zA-Z0-9]([a-zA-Z0-9\\-]{0,47}[a-zA-Z0-9])?";
  const UriParts uri;
  return {
      {"date", {date, 10, 10}},
      {"time", {time, 9, -1}},
      {"date-time", {date + "[Tt]" + time, 20, -1}},
      {"duration", {duration(), 3, -1}},
      {"uuid", {"[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}", 36, 36}},
      {"email", {R"([a-zA-Z0-9_+\-]+(\.[a-zA-Z0-9_+\-]+)*@[a-zA-Z0-9]([a-zA-Z0-9\-]*[a-zA-Z0-9])?(\.[a-zA-Z0-9]([a-zA-Z0-9\-]*[a-zA-Z0-9])?)+)", 5, -1}},
      {"ipv4", {R"(((25[0-5]|2[0-4]\d|1\d\d|[1-9]?\d)\.){3}(25[0-5]|2[0-4]\d|1\d\d|[1-9]?\d))", 7, 15}},
      {"ipv6", {ipv6(), 2, 39}},
      {"hostname", {label + "(\\." + label + "){0,4}", 1, 249}},
      {"uri", {uri.uri(), 2, -1}},
      {"uri-reference", {"(" + uri.uri() + ")|(" + uri.relative_reference() + ")", 0, -1}},
      {"json-pointer", {"(/([^~/]|~[01])*)*", 0, -1}},
  };
}

}  // namespace

const StringFormat* find_string_format(std::string_view name) {
  static const std::map<std::string, StringFormat, std::less<>> formats = build_formats();
  const auto it = formats.find(name);
  return it == formats.end() ? nullptr : &it->second;
}

}  // namespace loom::grammar
