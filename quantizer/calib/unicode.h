// UTF-8 decoding/encoding and the few Unicode properties tokenizers need (\p{L}, \p{N}, \s), without
// ICU: the tables are generated from Python's unicodedata (gen_unicode_tables.py).
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace marlinc::calib {

// One decoded code point and how many bytes it took. Invalid UTF-8 decodes as U+FFFD of length 1,
// so every byte of the input still belongs to exactly one "character" (tokenizers then byte-fall-back).
struct Utf8Char {
  char32_t cp;
  size_t len;
};
Utf8Char utf8_decode(std::string_view s, size_t pos);
// Byte length of the character starting at s[pos] (1 for invalid or continuation bytes).
size_t utf8_char_len(std::string_view s, size_t pos);
void utf8_append(std::string& out, char32_t cp);

bool is_letter(char32_t cp);      // general category L*
bool is_number(char32_t cp);      // general category N*
bool is_whitespace(char32_t cp);  // the White_Space property (what Rust's regex means by \s)
// True when NFC normalization can never change or reorder this code point, whatever surrounds it; a
// text made only of such code points is already in NFC.
bool is_nfc_safe(char32_t cp);
// Unicode Normalization Form C (UAX #15: canonical decomposition, canonical ordering, canonical
// composition) of UTF-8 text, as Hugging Face tokenizers' NFC normalizer applies it. Bytes that are not
// valid UTF-8 are kept as they are and block composition across them.
std::string nfc(std::string_view s);
// Scalar pieces of nfc, exposed for tests.
uint8_t combining_class(char32_t cp);
std::u32string nfc_ref(const std::u32string& s);

namespace detail {
struct CodeRange {
  char32_t lo, hi;  // inclusive
};
extern const CodeRange kLetterRanges[];
extern const size_t kLetterRanges_count;
extern const CodeRange kNumberRanges[];
extern const size_t kNumberRanges_count;
extern const CodeRange kNfcUnsafeRanges[];
extern const size_t kNfcUnsafeRanges_count;
struct CccRange {
  char32_t lo, hi;  // inclusive
  uint8_t ccc;      // canonical combining class (non-zero)
};
extern const CccRange kCombiningClasses[];
extern const size_t kCombiningClasses_count;
struct Decomposition {
  char32_t cp, first, second;  // second 0: a singleton
};
extern const Decomposition kDecompositions[];  // sorted by cp
extern const size_t kDecompositions_count;
struct Composition {
  char32_t first, second, composite;
};
extern const Composition kCompositions[];  // sorted by (first, second)
extern const size_t kCompositions_count;
}  // namespace detail

}  // namespace marlinc::calib
