#include "checkpoint/json_strict.h"

#include <set>
#include <vector>

#include "checkpoint/error.h"

namespace marlinc::detail {

bool valid_utf8(std::string_view s) {
  const auto* p = reinterpret_cast<const unsigned char*>(s.data());
  const size_t n = s.size();
  size_t i = 0;
  while (i < n) {
    const unsigned c = p[i];
    if (c < 0x80) { ++i; continue; }
    size_t len;
    unsigned cp, min;
    if ((c & 0xe0) == 0xc0) { len = 2; cp = c & 0x1f; min = 0x80; }
    else if ((c & 0xf0) == 0xe0) { len = 3; cp = c & 0x0f; min = 0x800; }
    else if ((c & 0xf8) == 0xf0) { len = 4; cp = c & 0x07; min = 0x10000; }
    else return false;
    if (n - i < len) return false;
    for (size_t j = 1; j < len; ++j) {
      if ((p[i + j] & 0xc0) != 0x80) return false;
      cp = (cp << 6) | (p[i + j] & 0x3f);
    }
    if (cp < min || cp > 0x10ffff || (cp >= 0xd800 && cp <= 0xdfff)) return false;
    i += len;
  }
  return true;
}

nlohmann::json parse_json_strict(std::string_view text, const std::string& label, int max_depth) {
  using json = nlohmann::json;
  // One key set per open object; an array pushes nothing, so track the container kinds too.
  std::vector<std::set<std::string>> keys;
  std::vector<bool> is_object;
  std::string path_hint;  // last key seen, for the error message
  auto cb = [&](int depth, json::parse_event_t ev, json& parsed) -> bool {
    switch (ev) {
      case json::parse_event_t::object_start:
      case json::parse_event_t::array_start:
        if (depth >= max_depth)
          bad_data(label + ": JSON nested deeper than " + std::to_string(max_depth) + " levels");
        is_object.push_back(ev == json::parse_event_t::object_start);
        if (ev == json::parse_event_t::object_start) keys.emplace_back();
        break;
      case json::parse_event_t::object_end:
      case json::parse_event_t::array_end:
        if (!is_object.empty()) {
          if (is_object.back()) keys.pop_back();
          is_object.pop_back();
        }
        break;
      case json::parse_event_t::key: {
        const std::string& k = parsed.get_ref<const std::string&>();
        if (!keys.empty() && !keys.back().insert(k).second)
          bad_data(label + ": " + k + ": duplicate key in JSON object (each name must appear once)");
        path_hint = k;
        break;
      }
      default: break;
    }
    return true;
  };
  // nlohmann's lexer ends the input at a NUL byte (as for C strings), which would accept "{...}\0junk".
  // JSON text cannot contain a raw NUL (inside strings it must be escaped), so any NUL is an error.
  if (const size_t nul = text.find('\0'); nul != std::string_view::npos)
    bad_data(label + ": malformed JSON: NUL byte at offset " + std::to_string(nul));
  try {
    return json::parse(text.begin(), text.end(), cb, /*allow_exceptions=*/true, /*ignore_comments=*/false);
  } catch (const json::exception& e) {
    bad_data(label + ": malformed JSON: " + e.what());
  }
}

}  // namespace marlinc::detail
