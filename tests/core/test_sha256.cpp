#include <string>

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
