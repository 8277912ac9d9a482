// NFC (UAX #15) from the tables gen_unicode_tables.py writes: full canonical decomposition, canonical
// ordering of non-starters by combining class, canonical composition onto the last starter.
#include <algorithm>

#include "quantizer/calib/unicode.h"

namespace marlinc::calib {
namespace {

// Hangul syllables decompose and compose by arithmetic (Unicode ch. 3.12), not by table.
constexpr char32_t kSBase = 0xAC00, kLBase = 0x1100, kVBase = 0x1161, kTBase = 0x11A7;
constexpr char32_t kLCount = 19, kVCount = 21, kTCount = 28, kNCount = kVCount * kTCount, kSCount = kLCount * kNCount;

void decompose_into(char32_t cp, std::u32string& out) {
  if (cp >= kSBase && cp < kSBase + kSCount) {
    const char32_t s = cp - kSBase;
    out += kLBase + s / kNCount;
    out += kVBase + (s % kNCount) / kTCount;
    if (s % kTCount != 0) out += kTBase + s % kTCount;
    return;
  }
  const auto* end = detail::kDecompositions + detail::kDecompositions_count;
  const auto* it = std::lower_bound(detail::kDecompositions, end, cp,
                                    [](const detail::Decomposition& d, char32_t c) { return d.cp < c; });
  if (it == end || it->cp != cp) {
    out += cp;
    return;
  }
  decompose_into(it->first, out);  // the first part may decompose again; the second never does
  if (it->second) decompose_into(it->second, out);
}

// The primary composite of (a, b), or 0.
char32_t compose(char32_t a, char32_t b) {
  if (a >= kLBase && a < kLBase + kLCount && b >= kVBase && b < kVBase + kVCount)
    return kSBase + ((a - kLBase) * kVCount + (b - kVBase)) * kTCount;
  if (a >= kSBase && a < kSBase + kSCount && (a - kSBase) % kTCount == 0 && b > kTBase && b < kTBase + kTCount)
    return a + (b - kTBase);
  const auto* end = detail::kCompositions + detail::kCompositions_count;
  const auto* it = std::lower_bound(detail::kCompositions, end, std::pair(a, b),
                                    [](const detail::Composition& c, std::pair<char32_t, char32_t> k) {
                                      return c.first != k.first ? c.first < k.first : c.second < k.second;
                                    });
  return it != end && it->first == a && it->second == b ? it->composite : 0;
}

// Sorts each run of non-starters by combining class, keeping the order of equal classes.
void canonical_order(std::u32string& s) {
  for (size_t i = 0; i < s.size();) {
    if (combining_class(s[i]) == 0) {
      ++i;
      continue;
    }
    size_t j = i;
    while (j < s.size() && combining_class(s[j]) != 0) ++j;
    std::stable_sort(s.begin() + std::ptrdiff_t(i), s.begin() + std::ptrdiff_t(j),
                     [](char32_t a, char32_t b) { return combining_class(a) < combining_class(b); });
    i = j;
  }
}

// Composes in place: each character joins the last starter unless a character between them blocks it
// (one of the same or a higher class, or a starter).
void canonical_compose(std::u32string& s) {
  if (s.empty()) return;
  size_t starter = 0, out = 1;
  int last_class = combining_class(s[0]) == 0 ? 0 : 256;  // no starter yet: nothing composes
  for (size_t i = 1; i < s.size(); ++i) {
    const char32_t c = s[i];
    const int cc = combining_class(c);
    const char32_t composite = last_class == 256 ? 0 : compose(s[starter], c);
    if (composite && (last_class < cc || last_class == 0)) {
      s[starter] = composite;
      continue;
    }
    if (cc == 0) starter = out;
    last_class = cc;
    s[out++] = c;
  }
  s.resize(out);
}

}  // namespace

uint8_t combining_class(char32_t cp) {
  if (cp < 0x300) return 0;
  const auto* end = detail::kCombiningClasses + detail::kCombiningClasses_count;
  const auto* it = std::upper_bound(detail::kCombiningClasses, end, cp,
                                    [](char32_t c, const detail::CccRange& r) { return c < r.lo; });
  if (it == detail::kCombiningClasses) return 0;
  --it;
  return cp <= it->hi ? it->ccc : 0;
}

std::u32string nfc_ref(const std::u32string& s) {
  std::u32string d;
  d.reserve(s.size());
  for (char32_t cp : s) decompose_into(cp, d);
  canonical_order(d);
  canonical_compose(d);
  return d;
}

std::string nfc(std::string_view s) {
  // Text made only of characters NFC leaves alone (the overwhelming case) is its own NFC.
  bool safe = true;
  for (size_t i = 0; i < s.size() && safe;) {
    const Utf8Char c = utf8_decode(s, i);
    safe = is_nfc_safe(c.cp) || (c.cp == 0xFFFD && c.len == 1);
    i += c.len;
  }
  if (safe) return std::string(s);
  std::string out;
  out.reserve(s.size());
  std::u32string run;
  auto flush = [&] {
    for (char32_t cp : nfc_ref(run)) utf8_append(out, cp);
    run.clear();
  };
  for (size_t i = 0; i < s.size();) {
    const Utf8Char c = utf8_decode(s, i);
    if (c.cp == 0xFFFD && c.len == 1) {  // not UTF-8: kept byte for byte, and nothing composes across it
      flush();
      out += s[i];
    } else {
      run += c.cp;
    }
    i += c.len;
  }
  flush();
  return out;
}

}  // namespace marlinc::calib
