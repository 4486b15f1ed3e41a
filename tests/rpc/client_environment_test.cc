// ClientSetting, the C++ clients' one reader of their environment variables: a set variable's
// value, nothing for an unset or empty one. (A name outside rpc/client_environment.h does not
// compile: TabledVariable's constructor is consteval.)
#include "rpc/client_environment.h"

#include <gtest/gtest.h>
#include <stdlib.h>

#include "rpc/address.h"

namespace collectived {
namespace {

TEST(ClientEnvironmentTest, ASetVariableIsReadAndAnUnsetOrEmptyOneIsNothing) {
  ASSERT_EQ(setenv("COLLECTIVED_RING_SPIN_US", "42", 1), 0);
  EXPECT_EQ(ClientSetting("COLLECTIVED_RING_SPIN_US"), "42");
  ASSERT_EQ(setenv("COLLECTIVED_RING_SPIN_US", "", 1), 0);
  EXPECT_FALSE(ClientSetting("COLLECTIVED_RING_SPIN_US").has_value());
  ASSERT_EQ(unsetenv("COLLECTIVED_RING_SPIN_US"), 0);
  EXPECT_FALSE(ClientSetting("COLLECTIVED_RING_SPIN_US").has_value());
}

TEST(ClientEnvironmentTest, TheSidecarAddressComesFromTheTabledVariableElseTheDefault) {
  ASSERT_EQ(setenv(kAddressEnvironmentVariable, "unix:///tmp/sidecar.sock", 1), 0);
  EXPECT_EQ(ResolveSidecarAddress(""), "unix:///tmp/sidecar.sock");
  ASSERT_EQ(unsetenv(kAddressEnvironmentVariable), 0);
  EXPECT_EQ(ResolveSidecarAddress(""), "unix:///run/collectived/collectived.sock");
  EXPECT_EQ(ResolveSidecarAddress("host:5"), "host:5");
}

TEST(ClientEnvironmentTest, EveryTabledVariableIsAClientVariable) {
  for (const ClientVariable& variable : kClientVariables) {
    EXPECT_TRUE(IsClientVariable(variable.name)) << variable.name;
    EXPECT_EQ(variable.name.substr(0, 12), "COLLECTIVED_") << variable.name;
  }
  EXPECT_FALSE(IsClientVariable("COLLECTIVED_NOT_A_CLIENT_VARIABLE"));
}

}  // namespace
}  // namespace collectived
