#include "checkpoint/json_strict.h"

#include <set>
#include <vector>

#include "checkpoint/error.h"

namespace marlinc::detail {

size_t utf8_invalid_at(std::string_view s) {
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
    else return i;
    if (n - i < len) return i;
    for (size_t j = 1; j < len; ++j) {
      if ((p[i + j] & 0xc0) != 0x80) return i;
      cp = (cp << 6) | (p[i + j] & 0x3f);
    }
    if (cp < min || cp > 0x10ffff || (cp >= 0xd800 && cp <= 0xdfff)) return i;
    i += len;
  }
  return std::string_view::npos;
}

bool valid_utf8(std::string_view s) { return utf8_invalid_at(s) == std::string_view::npos; }

namespace {

// A SAX pass that only checks what nlohmann's DOM parser lets through: duplicate keys (one key set per open object)
// and the nesting depth. Kept apart from building the DOM because nlohmann's callback parser rescans the parent
// container at every nested container's end, quadratic in a safetensors header's tensor count (40k tensors: 25 s).
class StrictChecks {
 public:
  using json = nlohmann::json;
  StrictChecks(const std::string& label, int max_depth) : label_(label), max_depth_(max_depth) {}
  bool null() { return true; }
  bool boolean(bool) { return true; }
  bool number_integer(json::number_integer_t) { return true; }
  bool number_unsigned(json::number_unsigned_t) { return true; }
  bool number_float(json::number_float_t, const std::string&) { return true; }
  bool string(json::string_t&) { return true; }
  bool binary(json::binary_t&) { return true; }
  bool start_object(std::size_t) { return open(true); }
  bool start_array(std::size_t) { return open(false); }
  bool end_object() { return close(); }
  bool end_array() { return close(); }
  bool key(json::string_t& k) {
    if (!keys_.empty() && !keys_.back().insert(k).second)
      bad_data(label_ + ": " + k + ": duplicate key in JSON object (each name must appear once)");
    return true;
  }
  bool parse_error(std::size_t, const std::string&, const nlohmann::detail::exception& e) {
    bad_data(label_ + ": malformed JSON: " + e.what());
  }

 private:
  bool open(bool object) {
    if (int(is_object_.size()) >= max_depth_)
      bad_data(label_ + ": JSON nested deeper than " + std::to_string(max_depth_) + " levels");
    is_object_.push_back(object);
    if (object) keys_.emplace_back();
    return true;
  }
  bool close() {
    if (!is_object_.empty()) {
      if (is_object_.back()) keys_.pop_back();
      is_object_.pop_back();
    }
    return true;
  }
  const std::string& label_;
  const int max_depth_;
  std::vector<std::set<std::string>> keys_;
  std::vector<bool> is_object_;  // an array pushes no key set
};

}  // namespace

nlohmann::json parse_json_strict(std::string_view text, const std::string& label, int max_depth) {
  using json = nlohmann::json;
  // nlohmann's lexer ends the input at a NUL byte (as for C strings), which would accept "{...}\0junk".
  // JSON text cannot contain a raw NUL (inside strings it must be escaped), so any NUL is an error.
  if (const size_t nul = text.find('\0'); nul != std::string_view::npos)
    bad_data(label + ": malformed JSON: NUL byte at offset " + std::to_string(nul));
  StrictChecks checks(label, max_depth);
  try {
    json::sax_parse(text.begin(), text.end(), &checks, json::input_format_t::json, /*strict=*/true,
                    /*ignore_comments=*/false);
    // Checked: no duplicate key, nesting bounded. The plain DOM parse is linear.
    return json::parse(text.begin(), text.end(), nullptr, /*allow_exceptions=*/true, /*ignore_comments=*/false);
  } catch (const json::exception& e) {
    bad_data(label + ": malformed JSON: " + e.what());
  }
}

}  // namespace marlinc::detail
