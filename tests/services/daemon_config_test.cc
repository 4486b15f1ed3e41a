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

TEST(DaemonConfigTest, SidecarNamesAreACommaSeparatedListOfNonEmptyNames) {
  auto defaults = Parse({});
  ASSERT_TRUE(defaults.ok());
  EXPECT_EQ(defaults->config.sidecar_names, std::vector<std::string>{"collectived"});
  auto parsed = Parse({"--sidecar-names", "collectived,node-agent.example"});
  ASSERT_TRUE(parsed.ok()) << parsed.status().ToString();
  EXPECT_EQ(parsed->config.sidecar_names,
            (std::vector<std::string>{"collectived", "node-agent.example"}));
  auto env = Parse({}, {{"COLLECTIVED_SIDECAR_NAMES", "a"}});
  ASSERT_TRUE(env.ok());
  EXPECT_EQ(env->config.sidecar_names, std::vector<std::string>{"a"});
  for (const std::string bad : {"", "a,,b", "a,"}) {
    auto refused = Parse({"--sidecar-names", bad});
    ASSERT_FALSE(refused.ok()) << bad;
    EXPECT_THAT(refused.status().message(), HasSubstr("--sidecar-names: expected comma-separated"));
  }
}

TEST(DaemonConfigTest, TlsFlagsAndTheirEnvironmentVariables) {
  auto parsed = Parse(
      {"--tls-cert", "/c.pem", "--tls-key=/k.pem", "--tls-refresh-s", "2", "--insecure-listen"},
      {{"COLLECTIVED_TLS_CA", "/ca.pem"},
       {"COLLECTIVED_TLS_CERT", "/env.pem"},
       {"COLLECTIVED_TLS_PEER_NAME", "collectived"}});
  ASSERT_TRUE(parsed.ok()) << parsed.status().ToString();
  EXPECT_EQ(parsed->config.tls_cert_file, "/c.pem");
  EXPECT_EQ(parsed->config.tls_key_file, "/k.pem");
  EXPECT_EQ(parsed->config.tls_ca_file, "/ca.pem");
  EXPECT_EQ(parsed->config.tls_peer_name, "collectived");
  EXPECT_EQ(parsed->config.tls_refresh_seconds, 2u);
  EXPECT_TRUE(parsed->config.insecure_listen);
  EXPECT_TRUE(parsed->config.tls_enabled());

  auto from_env = Parse({}, {{"COLLECTIVED_INSECURE_LISTEN", "1"}});
  ASSERT_TRUE(from_env.ok());
  EXPECT_TRUE(from_env->config.insecure_listen);
  auto off = Parse({"--insecure-listen=false"}, {{"COLLECTIVED_INSECURE_LISTEN", "1"}});
  ASSERT_TRUE(off.ok());
  EXPECT_FALSE(off->config.insecure_listen);
  auto bad = Parse({}, {{"COLLECTIVED_INSECURE_LISTEN", "maybe"}});
  ASSERT_FALSE(bad.ok());
  EXPECT_THAT(bad.status().message(), HasSubstr("COLLECTIVED_INSECURE_LISTEN"));
  auto zero = Parse({"--tls-refresh-s", "0"});
  ASSERT_FALSE(zero.ok());
  EXPECT_THAT(zero.status().message(), HasSubstr("--tls-refresh-s"));
}

TEST(DaemonConfigTest, LoopbackListenAddresses) {
  for (const char* address : {"127.0.0.1:7490", "127.1.2.3:0", "[::1]:7490", "localhost:7490"}) {
    EXPECT_TRUE(IsLoopbackListenAddress(address)) << address;
  }
  for (const char* address : {"0.0.0.0:7490", "[::]:7490", ":7490", "10.0.0.5:7490", "node-a:7490",
                              "[::ffff:10.0.0.1]:1", "128.0.0.1:1"}) {
    EXPECT_FALSE(IsLoopbackListenAddress(address)) << address;
  }
}

TEST(DaemonConfigTest, PlaintextOnTheNetworkIsRefusedUnlessAskedFor) {
  DaemonConfig config;  // the default: 0.0.0.0:7490 without TLS
  Status refused = CheckListenerSecurity(config);
  ASSERT_TRUE(refused.IsInvalidArgument());
  EXPECT_THAT(refused.message(), HasSubstr("non-loopback address --listen 0.0.0.0:7490"));
  EXPECT_THAT(refused.message(), HasSubstr("--tls-cert, --tls-key and --tls-ca"));
  EXPECT_THAT(refused.message(), HasSubstr("--listen 127.0.0.1:PORT"));
  EXPECT_THAT(refused.message(), HasSubstr("--insecure-listen"));

  config.insecure_listen = true;
  EXPECT_TRUE(CheckListenerSecurity(config).ok());
  EXPECT_EQ(TcpSecurityMode(config), "insecure (--insecure-listen)");
  config.insecure_listen = false;
  config.listen_address = "127.0.0.1:0";
  EXPECT_TRUE(CheckListenerSecurity(config).ok());
  EXPECT_EQ(TcpSecurityMode(config), "insecure (loopback)");
  config.listen_address = "";
  EXPECT_EQ(TcpSecurityMode(config), "off");
}

TEST(DaemonConfigTest, TlsFilesComeTogetherAndMustExist) {
  DaemonConfig config;
  config.tls_cert_file = "/nonexistent/tls.crt";
  Status partial = CheckListenerSecurity(config);
  ASSERT_TRUE(partial.IsInvalidArgument());
  EXPECT_THAT(partial.message(), HasSubstr("--tls-key and --tls-ca missing"));
  config.tls_key_file = "/nonexistent/tls.key";
  config.tls_ca_file = "/nonexistent/ca.crt";
  Status missing = CheckListenerSecurity(config);
  ASSERT_TRUE(missing.IsInvalidArgument());
  EXPECT_THAT(missing.message(),
              HasSubstr("--tls-cert /nonexistent/tls.crt: cannot read it: No such file"));
  EXPECT_EQ(TcpSecurityMode(config), "mutual-tls");
}

// A test and benchmark setting: off unless asked for, and bounded.
TEST(DaemonConfigTest, NcclHostIdIsUnsetByDefaultAndBounded) {
  auto defaults = Parse({});
  ASSERT_TRUE(defaults.ok()) << defaults.status().ToString();
  EXPECT_EQ(defaults->config.nccl_host_id, "");
  auto parsed = Parse({}, {{"COLLECTIVED_NCCL_HOST_ID", "bench-host-1"}});
  ASSERT_TRUE(parsed.ok()) << parsed.status().ToString();
  EXPECT_EQ(parsed->config.nccl_host_id, "bench-host-1");
  auto too_long = Parse({"--nccl-host-id", std::string(256, 'h')});
  ASSERT_FALSE(too_long.ok());
  EXPECT_THAT(too_long.status().message(), HasSubstr("--nccl-host-id"));
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
