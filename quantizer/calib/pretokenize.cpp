#include "quantizer/calib/pretokenize.h"

#include "quantizer/calib/unicode.h"

namespace marlinc::calib {

SplitFlavor gpt2_flavor() { return SplitFlavor{}; }

std::optional<SplitFlavor> flavor_from_pattern(std::string_view p) {
  static constexpr std::string_view kGpt2 =
      R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";
  static constexpr std::string_view kLlama3 =
      R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
  static constexpr std::string_view kQwen2 =
      R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
  if (p == kGpt2) return gpt2_flavor();
  if (p == kLlama3 || p == kQwen2) {
    SplitFlavor f;
    f.case_insensitive_contractions = true;
    f.any_letter_prefix = true;
    f.max_digits = p == kLlama3 ? 3 : 1;
    f.newline_rules = true;
    return f;
  }
  return std::nullopt;
}

namespace {

struct Cursor {
  std::string_view s;
  // Code point at byte offset i (U+FFFD past the end is never asked for: callers check i < size).
  char32_t cp(size_t i) const { return utf8_decode(s, i).cp; }
  size_t next(size_t i) const { return i + utf8_decode(s, i).len; }
  bool at_end(size_t i) const { return i >= s.size(); }
};

bool is_nl(char32_t c) { return c == '\r' || c == '\n'; }
bool is_other(char32_t c) { return !is_whitespace(c) && !is_letter(c) && !is_number(c); }  // [^\s\p{L}\p{N}]

// Length in bytes of the match of the pattern at byte offset p, or 0 when no alternative matches there.
size_t match_at(const Cursor& c, size_t p, const SplitFlavor& f) {
  const std::string_view s = c.s;
  const char32_t c0 = c.cp(p);
  // 1. contractions: 's 't 're 've 'm 'll 'd, tried in that order.
  if (c0 == '\'' && p + 1 < s.size()) {
    static constexpr std::string_view kSuffixes[] = {"s", "t", "re", "ve", "m", "ll", "d"};
    for (std::string_view suf : kSuffixes) {
      if (p + 1 + suf.size() > s.size()) continue;
      bool ok = true;
      for (size_t i = 0; i < suf.size() && ok; ++i) {
        char ch = s[p + 1 + i];
        if (f.case_insensitive_contractions && ch >= 'A' && ch <= 'Z') ch = static_cast<char>(ch + 32);
        ok = ch == suf[i];
      }
      if (ok) return 1 + suf.size();
    }
  }
  auto run = [&](size_t i, auto pred) {  // end of the maximal run of pred starting at i
    while (!c.at_end(i) && pred(c.cp(i))) i = c.next(i);
    return i;
  };
  // 2. letters with an optional one-character prefix.
  {
    const bool prefix_ok = f.any_letter_prefix ? (!is_nl(c0) && !is_letter(c0) && !is_number(c0)) : c0 == ' ';
    if (prefix_ok) {
      size_t q = c.next(p);
      if (!c.at_end(q) && is_letter(c.cp(q))) return run(q, is_letter) - p;
    }
    if (is_letter(c0)) return run(p, is_letter) - p;
  }
  // 3. numbers.
  if (f.max_digits == 0) {
    size_t q = c0 == ' ' ? c.next(p) : p;
    if (!c.at_end(q) && is_number(c.cp(q))) return run(q, is_number) - p;
  } else if (is_number(c0)) {
    size_t q = p;
    for (int k = 0; k < f.max_digits && !c.at_end(q) && is_number(c.cp(q)); ++k) q = c.next(q);
    return q - p;
  }
  // 4. ' ?[^\s\p{L}\p{N}]+' (then [\r\n]* in the newer patterns).
  {
    size_t q = p;
    if (c0 == ' ') {
      size_t q1 = c.next(p);
      if (!c.at_end(q1) && is_other(c.cp(q1))) q = q1;
    }
    if (is_other(c.cp(q))) {
      size_t e = run(q, is_other);
      if (f.newline_rules) e = run(e, is_nl);
      return e - p;
    }
  }
  if (!is_whitespace(c0)) return 0;
  const size_t ws_end = run(p, is_whitespace);
  // 5. '\s*[\r\n]+': the whitespace run up to and including its last newline.
  if (f.newline_rules) {
    size_t last_nl_end = 0;
    for (size_t i = p; i < ws_end; i = c.next(i))
      if (is_nl(c.cp(i))) last_nl_end = c.next(i);
    if (last_nl_end) return last_nl_end - p;
  }
  // 6. '\s+(?!\S)': the run, minus its last character when a non-space follows.
  if (ws_end >= s.size()) return ws_end - p;
  size_t last = p;
  for (size_t i = p; i < ws_end; i = c.next(i)) last = i;
  if (last > p) return last - p;
  // 7. '\s+'.
  return ws_end - p;
}

}  // namespace

std::vector<std::string_view> regex_split(std::string_view text, const SplitFlavor& f) {
  std::vector<std::string_view> out;
  Cursor c{text};
  size_t gap = 0, p = 0;
  while (p < text.size()) {
    size_t n = match_at(c, p, f);
    if (n == 0) {
      p = c.next(p);
      continue;
    }
    if (gap < p) out.push_back(text.substr(gap, p - gap));
    out.push_back(text.substr(p, n));
    p += n;
    gap = p;
  }
  if (gap < text.size()) out.push_back(text.substr(gap));
  return out;
}

}  // namespace marlinc::calib
