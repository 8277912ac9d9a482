// Internal: JSON parsing that rejects what nlohmann silently accepts but safetensors / HF tools treat
// as corrupt: duplicate object keys (nlohmann keeps the last) and absurd nesting.
#pragma once
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

namespace marlinc::detail {

// Parses `text`; throws Error(BadData) "<label>: <rule>" on malformed JSON, a duplicate key (named)
// or nesting deeper than max_depth.
nlohmann::json parse_json_strict(std::string_view text, const std::string& label, int max_depth = 64);

// True when `s` is well-formed UTF-8 (no overlong forms, surrogates or code points past U+10FFFF).
bool valid_utf8(std::string_view s);
// The offset of the first byte where `s` stops being well-formed UTF-8; npos when it is.
size_t utf8_invalid_at(std::string_view s);

}  // namespace marlinc::detail
