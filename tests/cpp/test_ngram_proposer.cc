// The prompt-lookup proposer: longest suffix first, freshest occurrence, k cap, min match, over
// a request's prompt and output read in place.
#include <gtest/gtest.h>

#include <stdexcept>
#include <vector>

#include "met/ngram_proposer.h"

namespace met {
namespace {

using V = std::vector<int32_t>;

// Proposals from tokens that are all prompt (the history a request has right after prefill).
V propose(NgramProposer& p, const V& prompt, int32_t k) {
  const V none;
  return p.propose({prompt, none}, k);
}

TEST(NgramProposer, NothingWithoutARecurringSuffix) {
  NgramProposer p;
  EXPECT_TRUE(propose(p, {}, 4).empty());
  EXPECT_TRUE(propose(p, {1, 2, 3, 4, 5}, 4).empty());
}

TEST(NgramProposer, CopiesWhatFollowedTheEarlierOccurrence) {
  NgramProposer p;
  const V tokens{9, 1, 2, 3, 4, 5, 6, 7, 1, 2, 3};
  EXPECT_EQ(propose(p, tokens, 3), (V{4, 5, 6}));
  EXPECT_EQ(propose(p, tokens, 10), (V{4, 5, 6, 7, 1, 2, 3}));  // capped at the history's end
  EXPECT_TRUE(propose(p, tokens, 0).empty());
}

TEST(NgramProposer, LongestSuffixWinsOverAFresherShorterOne) {
  NgramProposer p;
  // "5 1 2" is followed by 8 earlier; "1 2" alone was last followed by 7.
  EXPECT_EQ(propose(p, {5, 1, 2, 8, 0, 1, 2, 7, 0, 5, 1, 2}, 1), (V{8}));
}

TEST(NgramProposer, FreshestOccurrenceOfTheSameSuffixWins) {
  NgramProposer p;
  EXPECT_EQ(propose(p, {1, 2, 3, 9, 1, 2, 4, 8, 1, 2}, 2), (V{4, 8}));  // "1 2": 3, then 4
}

TEST(NgramProposer, MinimumMatchLengthIsHonoured) {
  NgramProposer loose({1, 4});
  EXPECT_EQ(propose(loose, {7, 3, 8, 3}, 1), (V{8}));
  NgramProposer strict({3, 4});
  V tokens{7, 1, 2, 9, 0, 1, 2};
  EXPECT_TRUE(propose(strict, tokens, 2).empty());  // only a 2-gram recurs
  tokens.push_back(9);
  tokens.push_back(0);
  EXPECT_EQ(propose(strict, tokens, 2), (V{1, 2}));  // "1 2 9 0" recurs
}

// Output arrives token by token after the prompt; n-grams span the two, and the index takes
// each new token once.
TEST(NgramProposer, GrowsTokenByTokenAsOutputArrives) {
  NgramProposer p;
  const V prompt{4, 5, 6};
  const V text{7, 8, 1, 4, 5, 6, 7, 8};
  V output;
  std::vector<V> drafts;
  for (int32_t t : text) {
    output.push_back(t);
    drafts.push_back(p.propose({prompt, output}, 2));
  }
  EXPECT_TRUE(drafts[3].empty());   // "1 4": no recurrence yet
  EXPECT_EQ(drafts[4], (V{6, 7}));  // "4 5" recurs: its first occurrence is all prompt
  EXPECT_EQ(drafts[5], (V{7, 8}));  // "4 5 6": followed by the output's first token
  EXPECT_EQ(drafts[7], (V{1, 4}));  // "5 6 7 8" -> 1 4
  EXPECT_EQ(p.indexed(), prompt.size() + text.size());
}

TEST(NgramProposer, RefusesAHistoryShorterThanItIndexed) {
  NgramProposer p;
  const V prompt{1, 2, 3}, output{4, 5};
  p.propose({prompt, output}, 2);
  EXPECT_THROW(propose(p, prompt, 2), std::logic_error);
}

TEST(NgramProposer, RejectsABadConfig) {
  EXPECT_THROW(NgramProposer({0, 4}), std::invalid_argument);
  EXPECT_THROW(NgramProposer({3, 2}), std::invalid_argument);
}

}  // namespace
}  // namespace met
