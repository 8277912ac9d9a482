#include <array>
#include <string>
#include <vector>

#include "checkpoint/sha256.h"
#include "tests/common.h"

using namespace marlinc;

TEST_CASE("SHA-256 matches the FIPS 180-4 test vectors", "[sha256]") {
  CHECK(sha256_hex({}) == "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
  Sha256 abc;
  abc.update(std::string_view("abc"));
  CHECK(abc.hex() == "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
  Sha256 two;
  two.update(std::string_view("abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq"));
  CHECK(two.hex() == "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1");
  // One million 'a', fed in uneven pieces so the buffering path is exercised.
  Sha256 million;
  std::string chunk(997, 'a');
  size_t left = 1000000;
  while (left) { size_t n = std::min(left, chunk.size()); million.update(chunk.data(), n); left -= n; }
  CHECK(million.hex() == "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0");
}

// The dispatching path (x86 SHA extensions where the CPU has them) against the scalar block
// function on messages padded by hand (FIPS 180-4 §5.1.1), for lengths around every block edge.
TEST_CASE("SHA-256 fast path equals the scalar block function", "[sha256]") {
  INFO("x86 SHA extensions in use: " << sha256_uses_shani());
  std::vector<uint8_t> msg(4096 + 130);
  uint32_t x = 12345;
  for (auto& b : msg) b = uint8_t((x = x * 1664525u + 1013904223u) >> 24);
  for (size_t len : {size_t(0), size_t(1), size_t(55), size_t(56), size_t(63), size_t(64), size_t(65), size_t(119),
                     size_t(128), size_t(1000), size_t(4096), msg.size()}) {
    std::vector<uint8_t> padded(msg.begin(), msg.begin() + std::ptrdiff_t(len));
    padded.push_back(0x80);
    while (padded.size() % 64 != 56) padded.push_back(0);
    for (int i = 7; i >= 0; --i) padded.push_back(uint8_t(uint64_t(len) * 8 >> (8 * i)));
    uint32_t st[8] = {0x6a09e667, 0xbb67ae85, 0x3c6ef372, 0xa54ff53a, 0x510e527f, 0x9b05688c, 0x1f83d9ab, 0x5be0cd19};
    sha256_blocks_ref(st, padded.data(), padded.size() / 64);
    std::array<uint8_t, 32> want;
    for (int i = 0; i < 8; ++i)
      for (int j = 0; j < 4; ++j) want[size_t(4 * i + j)] = uint8_t(st[i] >> (24 - 8 * j));
    Sha256 h;
    h.update(msg.data(), len / 3);  // uneven pieces: the buffered and the bulk path both run
    h.update(msg.data() + len / 3, len - len / 3);
    INFO("length " << len);
    CHECK(h.digest() == want);
  }
}
