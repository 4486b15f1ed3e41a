#include "rpc/torch_names.h"

#include <gtest/gtest.h>

#include <fstream>
#include <sstream>
#include <string>
#include <vector>

namespace collectived {
namespace {

// The rows of tests/data/torch_names.tsv whose first field is `kind`, split at tabs.
std::vector<std::vector<std::string>> Vectors(const std::string& kind) {
  std::ifstream file(COLLECTIVED_TORCH_NAMES_VECTORS);
  EXPECT_TRUE(file.good()) << "cannot read " << COLLECTIVED_TORCH_NAMES_VECTORS;
  std::vector<std::vector<std::string>> rows;
  for (std::string line; std::getline(file, line);) {
    if (line.empty() || line[0] == '#') continue;
    std::vector<std::string> fields;
    std::string field;
    std::istringstream split(line);
    while (std::getline(split, field, '\t')) fields.push_back(field);
    if (line.back() == '\t') fields.emplace_back();
    if (!fields.empty() && fields[0] == kind) rows.push_back(fields);
  }
  EXPECT_FALSE(rows.empty()) << "no '" << kind << "' rows";
  return rows;
}

TEST(TorchNames, GroupNamesFollowTheSharedVectors) {
  for (const auto& row : Vectors("name")) {
    ASSERT_EQ(row.size(), 5u);
    EXPECT_EQ(TorchGroupName(row[1], std::stoi(row[2]), row[3]), row[4])
        << "job '" << row[1] << "'";
  }
}

TEST(TorchNames, JobsOfGroupNamesFollowTheSharedVectors) {
  for (const auto& row : Vectors("job_of")) {
    ASSERT_EQ(row.size(), 3u);
    EXPECT_EQ(JobOfTorchGroupName(row[1]), row[2]) << "group '" << row[1] << "'";
  }
}

TEST(TorchNames, BootstrapRecordsRoundTripAndBadOnesAreRefused) {
  for (const auto& row : Vectors("record")) {
    ASSERT_EQ(row.size(), 4u);
    StatusOr<TorchBootstrap> parsed = ParseTorchBootstrapRecord(row[1]);
    ASSERT_TRUE(parsed.ok()) << parsed.status().ToString();
    EXPECT_EQ(parsed->group, row[2]);
    EXPECT_EQ(parsed->store_address, row[3]);
    EXPECT_EQ(TorchBootstrapRecord(*parsed), row[1]);
  }
  for (const auto& row : Vectors("bad_record")) {
    const std::string record = row.size() > 1 ? row[1] : "";
    StatusOr<TorchBootstrap> parsed = ParseTorchBootstrapRecord(record);
    ASSERT_FALSE(parsed.ok()) << "'" << record << "'";
    EXPECT_TRUE(parsed.status().IsInvalidArgument());
    EXPECT_NE(parsed.status().message().find("'" + record + "'"), std::string::npos);
    EXPECT_NE(parsed.status().message().find("NAME|STORE_ADDRESS"), std::string::npos);
  }
}

}  // namespace
}  // namespace collectived
