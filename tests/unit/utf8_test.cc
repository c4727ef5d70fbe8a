// sdk/core/utf8.h: what goes into a protobuf `string` field is valid UTF-8, and a message cut to a
// byte budget never ends inside a character.
#include "sdk/core/utf8.h"

#include <string>

#include "gtest/gtest.h"

namespace trainguard {
namespace {

// "GLHF! " then U+1F3D6 U+FE0F (beach with umbrella, emoji presentation): gloo's own message.
const std::string kGloo = "GLHF! \xf0\x9f\x8f\x96\xef\xb8\x8f";
const std::string kReplacement = "\xef\xbf\xbd";

TEST(Utf8, ValidTextIsReturnedAsIs) {
  EXPECT_EQ(ValidUtf8(""), "");
  EXPECT_EQ(ValidUtf8("plain ascii"), "plain ascii");
  EXPECT_EQ(ValidUtf8(kGloo), kGloo);
  EXPECT_EQ(ValidUtf8("caf\xc3\xa9 \xe2\x82\xac \xf4\x8f\xbf\xbf"), "caf\xc3\xa9 \xe2\x82\xac \xf4\x8f\xbf\xbf");
}

TEST(Utf8, ACharacterCutShortIsReplaced) {
  // The tail of a message cut at a byte budget: U+FE0F lost its last byte.
  EXPECT_EQ(ValidUtf8(kGloo.substr(0, kGloo.size() - 1)),
            "GLHF! \xf0\x9f\x8f\x96" + kReplacement + kReplacement);
  EXPECT_EQ(ValidUtf8("\xf0\x9f"), kReplacement + kReplacement);
}

TEST(Utf8, EveryIllFormedByteIsReplaced) {
  EXPECT_EQ(ValidUtf8("a\xff" "b"), "a" + kReplacement + "b");
  EXPECT_EQ(ValidUtf8("\x80"), kReplacement);                            // a lone continuation
  EXPECT_EQ(ValidUtf8("\xc0\xaf"), kReplacement + kReplacement);         // overlong '/'
  EXPECT_EQ(ValidUtf8("\xed\xa0\x80"), kReplacement + kReplacement + kReplacement);  // surrogate
  EXPECT_EQ(ValidUtf8("\xf4\x90\x80\x80"),                               // above U+10FFFF
            kReplacement + kReplacement + kReplacement + kReplacement);
}

TEST(Utf8, APrefixNeverEndsInsideACharacter) {
  const std::string text = kGloo + " end";
  const size_t emoji = 6;  // where U+1F3D6 begins
  EXPECT_EQ(Utf8Prefix(text, emoji), "GLHF! ");
  for (size_t cut = emoji + 1; cut < emoji + 4; ++cut) EXPECT_EQ(Utf8Prefix(text, cut), "GLHF! ");
  EXPECT_EQ(Utf8Prefix(text, emoji + 4), "GLHF! \xf0\x9f\x8f\x96");
  EXPECT_EQ(Utf8Prefix(text, emoji + 5), "GLHF! \xf0\x9f\x8f\x96");
  EXPECT_EQ(Utf8Prefix(text, emoji + 6), "GLHF! \xf0\x9f\x8f\x96");
  EXPECT_EQ(Utf8Prefix(text, emoji + 7), kGloo);
  EXPECT_EQ(Utf8Prefix(text, 1000), text);
  EXPECT_EQ(Utf8Prefix(text, 0), "");
  for (size_t cut = 0; cut <= text.size(); ++cut) {
    const std::string prefix(Utf8Prefix(text, cut));
    EXPECT_LE(prefix.size(), cut);
    EXPECT_EQ(ValidUtf8(prefix), prefix) << "cut at " << cut;
  }
}

}  // namespace
}  // namespace trainguard
