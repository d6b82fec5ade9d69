// The prompt-lookup proposer: longest suffix first, freshest occurrence, k cap, min match.
#include <gtest/gtest.h>

#include <vector>

#include "met/ngram_proposer.h"

namespace met {
namespace {

using V = std::vector<int32_t>;

TEST(NgramProposer, NothingWithoutARecurringSuffix) {
  NgramProposer p;
  EXPECT_TRUE(p.propose(4).empty());
  p.append(V{1, 2, 3, 4, 5});
  EXPECT_TRUE(p.propose(4).empty());
}

TEST(NgramProposer, CopiesWhatFollowedTheEarlierOccurrence) {
  NgramProposer p;
  p.append(V{9, 1, 2, 3, 4, 5, 6, 7, 1, 2, 3});
  EXPECT_EQ(p.propose(3), (V{4, 5, 6}));
  EXPECT_EQ(p.propose(10), (V{4, 5, 6, 7, 1, 2, 3}));  // capped at the history's end
  EXPECT_TRUE(p.propose(0).empty());
}

TEST(NgramProposer, LongestSuffixWinsOverAFresherShorterOne) {
  NgramProposer p;
  // "5 1 2" is followed by 8 earlier; "1 2" alone was last followed by 7.
  p.append(V{5, 1, 2, 8, 0, 1, 2, 7, 0, 5, 1, 2});
  EXPECT_EQ(p.propose(1), (V{8}));
}

TEST(NgramProposer, FreshestOccurrenceOfTheSameSuffixWins) {
  NgramProposer p;
  p.append(V{1, 2, 3, 9, 1, 2, 4, 8, 1, 2});  // "1 2" followed 3, then 4
  EXPECT_EQ(p.propose(2), (V{4, 8}));
}

TEST(NgramProposer, MinimumMatchLengthIsHonoured) {
  NgramProposer loose({1, 4});
  loose.append(V{7, 3, 8, 3});
  EXPECT_EQ(loose.propose(1), (V{8}));
  NgramProposer strict({3, 4});
  strict.append(V{7, 1, 2, 9, 0, 1, 2});
  EXPECT_TRUE(strict.propose(2).empty());  // only a 2-gram recurs
  strict.append(V{9});
  strict.append(V{0});
  EXPECT_EQ(strict.propose(2), (V{1, 2}));  // "1 2 9 0" recurs
}

TEST(NgramProposer, GrowsTokenByTokenAsOutputArrives) {
  NgramProposer p;
  const V text{4, 5, 6, 7, 8, 1, 4, 5, 6, 7, 8};
  std::vector<V> drafts;
  for (int32_t t : text) {
    p.append(t);
    drafts.push_back(p.propose(2));
  }
  EXPECT_TRUE(drafts[6].empty());    // "1 4": no recurrence yet
  EXPECT_EQ(drafts[7], (V{6, 7}));   // "4 5" recurs
  EXPECT_EQ(drafts[8], (V{7, 8}));   // "4 5 6"
  EXPECT_EQ(drafts[10], (V{1, 4}));  // "5 6 7 8" -> 1 4
  EXPECT_EQ(p.history(), text);
}

TEST(NgramProposer, RejectsABadConfig) {
  EXPECT_THROW(NgramProposer({0, 4}), std::invalid_argument);
  EXPECT_THROW(NgramProposer({3, 2}), std::invalid_argument);
}

}  // namespace
}  // namespace met
