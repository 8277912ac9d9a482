// QuantizedLinear's slice_n / concat_n (a fused module's parts: Phi-3's qkv_proj, gate_up_proj): joined
// parts dequantize to the parts' weights side by side, slicing takes each part back exactly, and parts
// that cannot form one module are refused by name.
#include <functional>
#include <string>
#include <vector>

#include "checkpoint/error.h"
#include "packer/quantized_linear.h"
#include "tests/common.h"
#include "tests/packer/packer_test_util.h"

using namespace marlinc;
using marlinc::test::error_of;
using marlinc::test::Rng;

namespace {

QuantizedLinear random_layer(Rng& r, const std::string& name, int64_t k, int64_t n, int group, bool sym, bool sparse) {
  QuantizedLinear q;
  q.name = name, q.k = k, q.n = n, q.bits = 4, q.group_size = group, q.sym = sym;
  q.codes = test::random_codes(r, k, n, 4);
  for (int64_t i = 0; i < q.groups() * n; ++i) q.scales.push_back(uint16_t(0x2000 + r.below(0x1000)));  // fp16, positive
  if (!sym) q.zeros = test::random_codes(r, q.groups(), n, 4);
  if (sparse) q.mask = test::random_mask_24(r, k, n);
  q.validate();
  return q;
}

}  // namespace

TEST_CASE("concat_n joins parts along n and slice_n takes each back", "[packer]") {
  Rng r(0x51ce);
  for (const bool sym : {true, false})
    for (const bool sparse : {false, true}) {
      INFO("sym " << sym << " 2:4 " << sparse);
      const std::vector<int64_t> widths = {64, 32, 32};
      std::vector<QuantizedLinear> parts;
      for (int64_t w : widths) parts.push_back(random_layer(r, "part" + std::to_string(parts.size()), 128, w, 32, sym, sparse));
      const QuantizedLinear j = concat_n(parts, "qkv_proj");
      j.validate();
      CHECK(j.name == "qkv_proj");
      CHECK(j.n == 128);
      const std::vector<float> wj = dequantize(j);  // [k, n]
      int64_t n0 = 0;
      for (size_t p = 0; p < parts.size(); ++p) {
        const std::vector<float> wp = dequantize(parts[p]);
        bool equal = true;
        for (int64_t row = 0; row < j.k; ++row)
          for (int64_t c = 0; c < widths[p]; ++c) equal = equal && wj[size_t(row * j.n + n0 + c)] == wp[size_t(row * widths[p] + c)];
        CHECK(equal);
        const QuantizedLinear s = slice_n(j, n0, widths[p]);
        CHECK((s.codes == parts[p].codes && s.scales == parts[p].scales && s.zeros == parts[p].zeros &&
               s.mask == parts[p].mask && s.n == parts[p].n));
        n0 += widths[p];
      }
    }
}

TEST_CASE("concat_n and slice_n refuse what cannot be one module, naming it", "[packer]") {
  Rng r(7);
  const QuantizedLinear a = random_layer(r, "q", 128, 64, 32, true, false);
  const QuantizedLinear other_group = random_layer(r, "k", 128, 32, 64, true, false);
  const QuantizedLinear asym = random_layer(r, "v", 128, 32, 32, false, false);
  CHECK(error_of([&] { concat_n({a, other_group}, "qkv_proj"); }).find("qkv_proj: part k differs from q") == 0);
  CHECK(error_of([&] { concat_n({a, asym}, "qkv_proj"); }).find("qkv_proj: part v differs from q") == 0);
  CHECK(error_of([&] { concat_n({}, "qkv_proj"); }).find("qkv_proj: no part to join") == 0);
  CHECK(error_of([&] { slice_n(a, 32, 64); }).find("q: output features [32, 96) are outside its n = 64") == 0);
  CHECK(error_of([&] { slice_n(a, -1, 8); }).find("outside") != std::string::npos);
}
