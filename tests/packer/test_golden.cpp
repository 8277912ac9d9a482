// Byte-for-byte equality with every golden file of ../shared/golden (outputs of the original Marlin
// and Sparse-Marlin packers, see its README): dense B and s from q and s_in; 2:4 B_24, meta and s_24
// from q, mask and s_in. Both the fast and the _ref packers are checked, and the inverses restore
// the inputs.
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include "checkpoint/safetensors.h"
#include "packer/marlin.h"
#include "tests/common.h"

using namespace marlinc;
namespace fs = std::filesystem;

namespace {

template <class T>
std::vector<T> read_tensor(const SafetensorsFile& f, const std::string& name, std::vector<int64_t> shape) {
  const TensorInfo* t = f.find(name);
  INFO(f.path().string() << ": tensor " << name);
  REQUIRE(t != nullptr);
  REQUIRE(t->shape == shape);
  REQUIRE(dtype_size(t->dtype) == sizeof(T));
  auto bytes = f.data(*t);
  std::vector<T> v(bytes.size() / sizeof(T));
  std::memcpy(v.data(), bytes.data(), bytes.size());  // copy: safetensors only guarantees 8-byte alignment
  return v;
}

template <class A, class B>
bool same_bytes(const std::vector<A>& a, const std::vector<B>& b) {
  return a.size() * sizeof(A) == b.size() * sizeof(B) && std::memcmp(a.data(), b.data(), a.size() * sizeof(A)) == 0;
}

struct Case {
  fs::path path;
  bool sparse;
  int64_t k, n;
  int group;
};

std::vector<Case> golden_cases() {
  std::vector<Case> out;
  for (const auto& e : fs::directory_iterator(test::shared_dir() / "golden")) {
    const std::string name = e.path().filename().string();
    if (e.path().extension() != ".safetensors") continue;
    Case c{e.path(), name.rfind("marlin24_", 0) == 0, 0, 0, 0};
    long long k = 0, n = 0;
    int g = 0;
    const char* fmt = c.sparse ? "marlin24_k%lld_n%lld_g%d.safetensors" : "marlin_k%lld_n%lld_g%d.safetensors";
    if (std::sscanf(name.c_str(), fmt, &k, &n, &g) != 3) continue;
    c.k = k;
    c.n = n;
    c.group = g;
    out.push_back(c);
  }
  return out;
}

}  // namespace

TEST_CASE("golden: every file of ../shared/golden is reproduced byte for byte", "[packer][golden]") {
  MARLINC_REQUIRE_SHARED();
  const auto cases = golden_cases();
  int dense = 0, sparse = 0;
  for (const Case& c : cases) {
    INFO(c.path.filename().string());
    auto f = SafetensorsFile::open(c.path);
    const int64_t k = c.k, n = c.n, G = c.group == -1 ? 1 : k / c.group;
    CHECK(f.metadata().at("k") == std::to_string(k));
    CHECK(f.metadata().at("n") == std::to_string(n));
    CHECK(f.metadata().at("group_size") == std::to_string(c.group));
    auto q = read_tensor<int8_t>(f, "q", {k, n});
    auto s_in = read_tensor<uint16_t>(f, "s_in", {G, n});
    std::vector<uint8_t> codes(q.size());
    for (size_t i = 0; i < q.size(); ++i) codes[i] = uint8_t(q[i] + 8);  // uint4b8: stored code = q + 8

    if (!c.sparse) {
      ++dense;
      auto B = read_tensor<int32_t>(f, "B", {k / 16, 2 * n});
      auto s = read_tensor<uint16_t>(f, "s", {G, n});
      CHECK(same_bytes(marlin::pack_weights(codes.data(), k, n, 4), B));
      CHECK(same_bytes(marlin::pack_weights_ref(codes.data(), k, n, 4), B));
      CHECK(same_bytes(marlin::permute_scales(s_in.data(), G, n), s));
      CHECK(marlin::unpack_weights(B.data(), k, n, 4) == codes);
      CHECK(marlin::unpermute_scales(s.data(), G, n) == s_in);
    } else {
      ++sparse;
      auto mask = read_tensor<uint8_t>(f, "mask", {k, n});
      auto B24 = read_tensor<int32_t>(f, "B_24", {k / 32, 2 * n});
      auto meta = read_tensor<int16_t>(f, "meta", {n, k / 16});  // same bytes as our [k/32, 2n]
      auto s24 = read_tensor<uint16_t>(f, "s_24", {G, n});
      for (int fast = 0; fast < 2; ++fast) {
        INFO("fast=" << fast);
        auto p = fast ? marlin::pack_24(codes.data(), mask.data(), k, n, 4) : marlin::pack_24_ref(codes.data(), mask.data(), k, n, 4);
        CHECK(same_bytes(p.B24, B24));
        CHECK(same_bytes(p.meta, meta));
      }
      CHECK(same_bytes(marlin::permute_scales_24(s_in.data(), G, n), s24));
      CHECK(marlin::unpermute_scales_24(s24.data(), G, n) == s_in);
      // Inverse: kept codes and the mask come back; pruned positions read as the zero code 8.
      std::vector<uint8_t> cq(size_t(k * n)), cm(size_t(k * n));
      marlin::unpack_24(B24.data(), meta.data(), k, n, 4, cq.data(), cm.data());
      CHECK(cm == mask);
      bool kept_equal = true;
      for (size_t i = 0; i < cq.size(); ++i) kept_equal &= cq[i] == (mask[i] ? codes[i] : uint8_t(8));
      CHECK(kept_equal);
    }
  }
  // The README lists 4 dense and 3 sparse cases; all must have been found and checked.
  CHECK(dense == 4);
  CHECK(sparse == 3);
}
