#include <gtest/gtest.h>
#include <signal.h>
#include <cstdlib>
#include "tests/sidecar/group_ops.h"
namespace collectived::sidecar_test {
TEST(Scratch, Shutdown) {
  int mode = std::atoi(getenv("MODE"));
  std::string dir = MakeTempDir("cstest");
  auto sidecar = SidecarProcess::Start(dir, "A");
  ASSERT_TRUE(sidecar.ok());
  {
    if (mode >= 1) {
      auto client = Client::Connect((*sidecar)->unix_address());
      ASSERT_TRUE(client.ok());
      if (mode >= 2) { auto b = (*client)->AllocateBuffer(4096); ASSERT_TRUE(b.ok()); }
      if (mode >= 3) { ASSERT_TRUE((*client)->Ping(std::chrono::milliseconds(1000)).ok()); }
    }
  }
  auto t0 = std::chrono::steady_clock::now();
  sidecar->reset();
  fprintf(stderr, "mode %d: teardown %ld ms\n", mode, (long)std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now()-t0).count());
}
}
