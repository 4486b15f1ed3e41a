// PostMortems: the kept final states of failed groups, their JSON, and the files written at the
// moment of failure.
#include "engine/group/core/post_mortems.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <stdlib.h>

#include <filesystem>
#include <fstream>
#include <sstream>

namespace collectived {
namespace {

using ::testing::HasSubstr;

OpRecord Record(uint64_t sequence, OpRecord::State state, Status status = Status::Ok()) {
  OpRecord record;
  record.group = "g";
  record.sequence_number = sequence;
  record.kind = OpKind::kAllReduce;
  record.dtype = DType::kFloat32;
  record.count = 4;
  record.state = state;
  record.status = std::move(status);
  return record;
}

PostMortem Failed(const std::string& group) {
  PostMortem p;
  p.group = group;
  p.sidecar_id = "host/12-34";
  p.device = "cpu";
  p.members = {0, 1};
  p.sidecar_of_rank = {"host/12-34", "other/5-6"};
  p.address_of_rank = {"10.0.0.1:7490", "10.0.0.2:7490"};
  p.local_group_ranks = {0};
  p.sequence_number = 2;
  p.failure = Status::Timeout("allreduce (seq 2) timed out: ranks [1] never issued it");
  p.failed_at = std::chrono::system_clock::time_point(std::chrono::milliseconds(1700000000123));
  p.records.push_back(Record(1, OpRecord::State::kCompleted));
  OpRecord caught = Record(2, OpRecord::State::kFailed, p.failure);
  caught.group_size = 2;
  caught.known_arrivals_us = {{0, 0}};
  p.records.push_back(caught);
  return p;
}

TEST(PostMortems, TheJsonNamesTheFailureAndTheRanksThatNeverArrived) {
  PostMortem p = Failed("late \"one\"\n");
  const std::string json = PostMortemJson(p);
  EXPECT_THAT(json, HasSubstr("\"format\":\"collectived.post_mortem.v1\""));
  EXPECT_THAT(json, HasSubstr("\"group\":\"late \\\"one\\\"\\n\""));  // escaped
  EXPECT_THAT(json, HasSubstr("\"failure\":{\"kind\":\"timeout\""));
  EXPECT_THAT(json, HasSubstr("\"members\":[0,1]"));
  EXPECT_THAT(json, HasSubstr("\"address_of_rank\":[\"10.0.0.1:7490\",\"10.0.0.2:7490\"]"));
  EXPECT_THAT(json, HasSubstr("\"failed_unix_us\":1700000000123000"));
  // The op the failure caught names rank 1; the completed one names nobody.
  EXPECT_THAT(json, HasSubstr("\"sequence_number\":2,\"op\":\"allreduce\",\"state\":\"failed\""));
  EXPECT_THAT(json, HasSubstr("\"rank_arrival_us\":[0,-1],\"ranks_not_arrived\":[1]"));
  EXPECT_THAT(json, HasSubstr("\"state\":\"completed\""));
  EXPECT_EQ(json.back(), '\n');
  EXPECT_TRUE(p.Caught(p.records[1]));
  EXPECT_FALSE(p.Caught(p.records[0]));
}

// A sidecar of a group that agrees through summaries knows the arrival of its own ranks and of the
// group's first and last only: once the op's data phase began nobody is reported as not arrived.
TEST(PostMortems, AnAgreedOpWaitsForNoRankWhateverArrivalsThisSidecarKnows) {
  OpRecord agreed = Record(3, OpRecord::State::kRunning);
  agreed.group_size = 5;
  agreed.known_arrivals_us = {{0, 0}, {4, 17}};
  EXPECT_EQ(agreed.RankArrivalUs(), (std::vector<int64_t>{0, -1, -1, -1, 17}));
  EXPECT_EQ(PostMortem::RanksNotArrived(agreed), (std::vector<int>{1, 2, 3}));
  agreed.data_started_us = 40;
  EXPECT_TRUE(PostMortem::RanksNotArrived(agreed).empty());
}

TEST(PostMortems, TheLastFewAreKeptAndTheNewestOfANameWins) {
  PostMortems kept(2, "");
  kept.Record(Failed("a"));
  PostMortem again = Failed("a");
  again.sequence_number = 9;
  kept.Record(again);
  kept.Record(Failed("b"));
  ASSERT_EQ(kept.List().size(), 2u);
  EXPECT_EQ(kept.Find("a")->sequence_number, 9u);  // the first "a" went, oldest first
  EXPECT_TRUE(kept.Find("b").has_value());
  EXPECT_FALSE(kept.Find("c").has_value());
  PostMortems none(0, "");
  none.Record(Failed("a"));
  EXPECT_FALSE(none.Find("a").has_value());
}

TEST(PostMortems, EachFailureIsWrittenWholeToTheDirectory) {
  char pattern[] = "/tmp/post-mortems-XXXXXX";
  ASSERT_NE(mkdtemp(pattern), nullptr);
  const std::string directory = pattern;
  PostMortems kept(4, directory);
  kept.Record(Failed("late/../x"));  // a name that is not file-safe stays inside the directory
  std::vector<std::string> files;
  for (const auto& entry : std::filesystem::directory_iterator(directory))
    files.push_back(entry.path().filename());
  ASSERT_EQ(files.size(), 1u);
  EXPECT_EQ(files[0], "late_.._x.host_12-34.1700000000123.json");
  std::ifstream in(directory + "/" + files[0]);
  std::stringstream text;
  text << in.rdbuf();
  EXPECT_EQ(text.str(), PostMortemJson(Failed("late/../x")));
  std::filesystem::remove_all(directory);
}

TEST(PostMortems, AnUnwritableDirectoryIsLoggedNotFatal) {
  PostMortems kept(1, "/proc/no-such-directory");
  kept.Record(Failed("a"));
  EXPECT_TRUE(kept.Find("a").has_value());
}

}  // namespace
}  // namespace collectived
