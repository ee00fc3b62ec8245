// backend_names_test.cpp — the backend-independent parts of backend.h: activation names
// and parsing, and which keys each attention mask lets a query see.
#include <gtest/gtest.h>

#include <string>

#include "tpcheck/backend.h"
#include "tpcheck/error.h"

namespace tpcheck {
namespace {

TEST(ActivationNames, RoundTripGatedAndUnknownNameIsRejected) {
  for (Activation a : {Activation::kGelu, Activation::kRelu, Activation::kSrelu, Activation::kQgelu,
                       Activation::kGeglu, Activation::kSwiglu}) {
    EXPECT_EQ(parse_activation(activation_name(a)), a);
    EXPECT_EQ(is_gated(a), a == Activation::kGeglu || a == Activation::kSwiglu);
  }
  EXPECT_EQ(activation_name(Activation::kSrelu), "srelu");
  try {
    parse_activation("gleu");
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kInput);
    EXPECT_EQ(std::string(e.what()),
              "unknown activation 'gleu'; expected one of gelu, relu, srelu, qgelu, geglu, swiglu");
  }
}

// The mask as a string of 0/1 rows, to compare against a drawn picture.
std::string picture(const AttentionMask& mask, int s) {
  std::string out;
  for (int i = 0; i < s; ++i) {
    for (int j = 0; j < s; ++j) out += mask.allows(i, j) ? '1' : '0';
    out += '\n';
  }
  return out;
}

TEST(AttentionMask, AllowsMatchesTheDefinitions) {
  using T = AttentionMask::Type;
  EXPECT_EQ(picture({T::kNoMask, -1, -1}, 3), "111\n111\n111\n");
  EXPECT_EQ(picture({T::kCausal, -1, -1}, 4), "1000\n1100\n1110\n1111\n");
  EXPECT_EQ(picture({T::kCausal, 1, -1}, 4), "1000\n1100\n0110\n0011\n");
  EXPECT_EQ(picture({T::kSlidingWindow, 1, 2}, 5), "11100\n11110\n01111\n00111\n00011\n");
  EXPECT_EQ(picture({T::kSlidingWindow, -1, 0}, 3), "100\n110\n111\n");
  EXPECT_EQ(picture({T::kSlidingWindow, 0, -1}, 3), "111\n011\n001\n");
}

}  // namespace
}  // namespace tpcheck
