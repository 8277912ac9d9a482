#include "quantizer/calib/unicode.h"

#include <algorithm>

namespace marlinc::calib {

Utf8Char utf8_decode(std::string_view s, size_t pos) {
  const auto b = [&](size_t i) { return static_cast<uint8_t>(s[i]); };
  const uint8_t c0 = b(pos);
  if (c0 < 0x80) return {c0, 1};
  size_t n = 0;
  char32_t cp = 0, min = 0;
  if ((c0 & 0xE0) == 0xC0) { n = 2; cp = c0 & 0x1F; min = 0x80; }
  else if ((c0 & 0xF0) == 0xE0) { n = 3; cp = c0 & 0x0F; min = 0x800; }
  else if ((c0 & 0xF8) == 0xF0) { n = 4; cp = c0 & 0x07; min = 0x10000; }
  else return {0xFFFD, 1};
  if (pos + n > s.size()) return {0xFFFD, 1};
  for (size_t i = 1; i < n; ++i) {
    if ((b(pos + i) & 0xC0) != 0x80) return {0xFFFD, 1};
    cp = (cp << 6) | (b(pos + i) & 0x3F);
  }
  // Overlong forms, surrogates and values past U+10FFFF are not valid UTF-8.
  if (cp < min || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return {0xFFFD, 1};
  return {cp, n};
}

size_t utf8_char_len(std::string_view s, size_t pos) { return utf8_decode(s, pos).len; }

void utf8_append(std::string& out, char32_t cp) {
  if (cp < 0x80) {
    out.push_back(static_cast<char>(cp));
  } else if (cp < 0x800) {
    out.push_back(static_cast<char>(0xC0 | (cp >> 6)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else if (cp < 0x10000) {
    out.push_back(static_cast<char>(0xE0 | (cp >> 12)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else {
    out.push_back(static_cast<char>(0xF0 | (cp >> 18)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 12) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  }
}

static bool in_ranges(const detail::CodeRange* r, size_t n, char32_t cp) {
  const detail::CodeRange* end = r + n;
  const detail::CodeRange* it =
      std::upper_bound(r, end, cp, [](char32_t v, const detail::CodeRange& x) { return v < x.lo; });
  return it != r && cp <= (it - 1)->hi;
}

bool is_letter(char32_t cp) {
  if (cp < 0x80) return (cp | 0x20) >= 'a' && (cp | 0x20) <= 'z';
  return in_ranges(detail::kLetterRanges, detail::kLetterRanges_count, cp);
}
bool is_number(char32_t cp) {
  if (cp < 0x80) return cp >= '0' && cp <= '9';
  return in_ranges(detail::kNumberRanges, detail::kNumberRanges_count, cp);
}
bool is_whitespace(char32_t cp) {
  return (cp >= 0x09 && cp <= 0x0D) || cp == 0x20 || cp == 0x85 || cp == 0xA0 || cp == 0x1680 ||
         (cp >= 0x2000 && cp <= 0x200A) || cp == 0x2028 || cp == 0x2029 || cp == 0x202F || cp == 0x205F ||
         cp == 0x3000;
}

bool is_nfc_safe(char32_t cp) {
  return cp < 0x300 || !in_ranges(detail::kNfcUnsafeRanges, detail::kNfcUnsafeRanges_count, cp);
}

}  // namespace marlinc::calib
