// Regex pre-tokenization of byte-level BPE tokenizers (GPT-2, Llama-3, Qwen2/3), written by hand
// because std::regex has no \p{L}/\p{N}. Only the known patterns are accepted; each is matched with
// the same leftmost-first alternation and greedy backtracking the Rust regex crate applies.
#pragma once
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace marlinc::calib {

struct SplitFlavor {
  bool case_insensitive_contractions = false;  // (?i:'s|...) (Llama-3, Qwen) vs 's|... (GPT-2)
  bool any_letter_prefix = false;  // [^\r\n\p{L}\p{N}]?\p{L}+ (Llama-3, Qwen) vs ' ?\p{L}+' (GPT-2)
  int max_digits = 0;              // \p{N}{1,max}; 0: ' ?\p{N}+' (GPT-2)
  bool newline_rules = false;      // ' ?[^\s\p{L}\p{N}]+[\r\n]*' and '\s*[\r\n]+' (Llama-3, Qwen)
};

// The GPT-2 pattern that ByteLevel(use_regex=true) applies.
SplitFlavor gpt2_flavor();
// Recognises a Split pre-tokenizer's regex; nullopt when it is not one of the known patterns.
std::optional<SplitFlavor> flavor_from_pattern(std::string_view pattern);

// Splits text into the matches of the pattern and the gaps between them (behaviour "Isolated"),
// in order; concatenating the pieces gives the text back.
std::vector<std::string_view> regex_split(std::string_view text, const SplitFlavor& f);

}  // namespace marlinc::calib
