#include "engine/stop_strings.h"

#include <algorithm>

namespace loom {

size_t find_stop_string(const std::string& text, const std::vector<std::string>& stops, size_t* length) {
  size_t best = std::string::npos, best_length = 0;
  for (const auto& stop : stops) {
    if (stop.empty()) continue;
    const size_t at = text.find(stop);
    if (at < best || (at == best && at != std::string::npos && stop.size() > best_length)) {
      best = at;
      best_length = stop.size();
    }
  }
  if (length != nullptr) *length = best_length;
  return best;
}

size_t stop_string_hold_back_length(const std::string& text, const std::vector<std::string>& stops) {
  size_t hold = 0;
  for (const auto& stop : stops) {
    if (stop.empty()) continue;
    for (size_t length = std::min(stop.size() - 1, text.size()); length > hold; --length) {
      if (text.compare(text.size() - length, length, stop, 0, length) == 0) {
        hold = length;
        break;
      }
    }
  }
  return hold;
}

StopStringFilter::Result StopStringFilter::push(const std::string& text, bool final_flush, bool match_stops) {
  Result result;
  pending_ += text;
  if (match_stops) {
    size_t stop_length = 0;
    const size_t stop_at = find_stop_string(pending_, stops_, &stop_length);
    if (stop_at != std::string::npos) {
      pending_.resize(include_stop_ ? stop_at + stop_length : stop_at);
      result.stopped = true;
      final_flush = true;
    }
  }
  const size_t ready = final_flush || !match_stops ? pending_.size()
                                                   : pending_.size() - stop_string_hold_back_length(pending_, stops_);
  result.text = pending_.substr(0, ready);
  pending_.erase(0, ready);
  return result;
}

}  // namespace loom
