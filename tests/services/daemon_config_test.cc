#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "services/collectived/config.h"

namespace collectived {
namespace {

using ::testing::HasSubstr;

StatusOr<ParsedCommandLine> Parse(std::vector<std::string> args,
                                  std::map<std::string, std::string> env = {}) {
  return ParseDaemonCommandLine(args, env);
}

TEST(DaemonConfigTest, DefaultsServeTheDefaultSocketAndTcp) {
  auto parsed = Parse({});
  ASSERT_TRUE(parsed.ok()) << parsed.status().ToString();
  EXPECT_EQ(parsed->config.socket_path, "/run/collectived/collectived.sock");
  EXPECT_EQ(parsed->config.listen_address, "0.0.0.0:7490");
  EXPECT_EQ(parsed->config.metrics_address, "0.0.0.0:9490");
  EXPECT_EQ(parsed->config.socket_mode, 0660u);
  EXPECT_EQ(parsed->config.log_level, LogLevel::kInfo);
  EXPECT_FALSE(parsed->config.advertise_host.empty()) << "defaults to the host name";
  EXPECT_FALSE(parsed->show_help);
}

TEST(DaemonConfigTest, FlagsInBothSpellings) {
  auto parsed = Parse({"--socket", "/tmp/a.sock", "--listen=127.0.0.1:0", "--advertise", "node-a",
                       "--metrics=", "--log-level", "debug", "--socket-mode=0600",
                       "--store-timeout-ms", "1500"});
  ASSERT_TRUE(parsed.ok()) << parsed.status().ToString();
  EXPECT_EQ(parsed->config.socket_path, "/tmp/a.sock");
  EXPECT_EQ(parsed->config.listen_address, "127.0.0.1:0");
  EXPECT_EQ(parsed->config.advertise_host, "node-a");
  EXPECT_EQ(parsed->config.metrics_address, "");
  EXPECT_EQ(parsed->config.log_level, LogLevel::kDebug);
  EXPECT_EQ(parsed->config.socket_mode, 0600u);
  EXPECT_EQ(parsed->config.store_timeout, std::chrono::milliseconds(1500));
}

TEST(DaemonConfigTest, EnvironmentIsAFallbackThatFlagsOverride) {
  auto parsed = Parse({"--listen", "127.0.0.1:9000"}, {{"COLLECTIVED_LISTEN", "127.0.0.1:8000"},
                                                       {"COLLECTIVED_SOCKET", "/tmp/env.sock"},
                                                       {"COLLECTIVED_LOG_LEVEL", "warning"}});
  ASSERT_TRUE(parsed.ok()) << parsed.status().ToString();
  EXPECT_EQ(parsed->config.listen_address, "127.0.0.1:9000");
  EXPECT_EQ(parsed->config.socket_path, "/tmp/env.sock");
  EXPECT_EQ(parsed->config.log_level, LogLevel::kWarning);
}

TEST(DaemonConfigTest, BadInputIsNamed) {
  struct Case {
    std::vector<std::string> args;
    std::string expected;
  };
  for (const Case& c : std::vector<Case>{
           {{"--bogus"}, "unknown flag '--bogus'"},
           {{"--listen"}, "--listen needs a value"},
           {{"--listen", "nohostport"}, "--listen: expected HOST:PORT"},
           {{"--listen", "127.0.0.1:99999"}, "bad port"},
           {{"--log-level", "loud"}, "--log-level"},
           {{"--socket-mode", "999"}, "--socket-mode"},
           {{"--store-timeout-ms", "-5"}, "--store-timeout-ms"},
           {{"--socket=", "--listen="}, "nothing to serve"},
       }) {
    auto parsed = Parse(c.args);
    ASSERT_FALSE(parsed.ok()) << c.args.front();
    EXPECT_TRUE(parsed.status().IsInvalidArgument());
    EXPECT_THAT(parsed.status().message(), HasSubstr(c.expected));
  }
}

TEST(DaemonConfigTest, BadEnvironmentNamesTheVariable) {
  auto parsed = Parse({}, {{"COLLECTIVED_LOG_LEVEL", "chatty"}});
  ASSERT_FALSE(parsed.ok());
  EXPECT_THAT(parsed.status().message(), HasSubstr("COLLECTIVED_LOG_LEVEL"));
}

TEST(DaemonConfigTest, AdminCredentialsFromFlagsAndEnvironment) {
  auto none = Parse({});
  ASSERT_TRUE(none.ok()) << none.status().ToString();
  EXPECT_TRUE(none->config.admin_token_file.empty());
  EXPECT_TRUE(none->config.admin_names.empty());

  auto flags = Parse({"--admin-token-file", "/etc/collectived/admin-token",
                      "--admin-names=ops,oncall.example.com"});
  ASSERT_TRUE(flags.ok()) << flags.status().ToString();
  EXPECT_EQ(flags->config.admin_token_file, "/etc/collectived/admin-token");
  EXPECT_EQ(flags->config.admin_names, (std::vector<std::string>{"ops", "oncall.example.com"}));

  auto env = Parse(
      {}, {{"COLLECTIVED_ADMIN_TOKEN_FILE", "/run/token"}, {"COLLECTIVED_ADMIN_NAMES", "admin"}});
  ASSERT_TRUE(env.ok()) << env.status().ToString();
  EXPECT_EQ(env->config.admin_token_file, "/run/token");
  EXPECT_EQ(env->config.admin_names, std::vector<std::string>{"admin"});
  // An empty list means none; an empty name in a list is a mistake.
  auto cleared = Parse({"--admin-names="}, {{"COLLECTIVED_ADMIN_NAMES", "admin"}});
  ASSERT_TRUE(cleared.ok()) << cleared.status().ToString();
  EXPECT_TRUE(cleared->config.admin_names.empty());
  auto bad = Parse({"--admin-names", "ops,,oncall"});
  EXPECT_TRUE(bad.status().IsInvalidArgument());
  EXPECT_THAT(bad.status().message(), HasSubstr("--admin-names"));
}

TEST(DaemonConfigTest, HelpAndVersion) {
  auto parsed = Parse({"--help", "--version"});
  ASSERT_TRUE(parsed.ok());
  EXPECT_TRUE(parsed->show_help);
  EXPECT_TRUE(parsed->show_version);
  for (const char* flag : {"--socket", "--listen", "--advertise", "--metrics", "--log-level",
                           "COLLECTIVED_SOCKET", "COLLECTIVED_LISTEN"}) {
    EXPECT_THAT(DaemonUsage(), HasSubstr(flag));
  }
}

}  // namespace
}  // namespace collectived
