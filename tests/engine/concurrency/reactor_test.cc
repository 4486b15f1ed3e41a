// Reactor: one thread runs the handlers of every watched descriptor.
#include "engine/concurrency/reactor.h"

#include <gtest/gtest.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <future>

namespace collectived {
namespace {

using std::chrono::milliseconds;
using std::chrono::seconds;

class SocketPair {
 public:
  SocketPair() { EXPECT_EQ(socketpair(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK, 0, fds_), 0); }
  ~SocketPair() {
    close(fds_[0]);
    close(fds_[1]);
  }
  int here() const { return fds_[0]; }
  int there() const { return fds_[1]; }

 private:
  int fds_[2];
};

TEST(ReactorTest, RunsAHandlerWhenItsSocketIsReadable) {
  StatusOr<std::unique_ptr<Reactor>> reactor = Reactor::Create();
  ASSERT_TRUE(reactor.ok());
  SocketPair pair;
  std::promise<std::string> received;
  std::atomic<bool> on_reactor{false};
  ASSERT_TRUE((*reactor)
                  ->Watch(pair.here(), EPOLLIN,
                          [&](uint32_t events) {
                            char byte;
                            if ((events & EPOLLIN) && read(pair.here(), &byte, 1) == 1) {
                              on_reactor = (*reactor)->OnReactorThread();
                              received.set_value(std::string(1, byte));
                            }
                          })
                  .ok());
  ASSERT_EQ(write(pair.there(), "x", 1), 1);
  auto result = received.get_future();
  ASSERT_EQ(result.wait_for(seconds(10)), std::future_status::ready);
  EXPECT_EQ(result.get(), "x");
  EXPECT_TRUE(on_reactor.load());
  (*reactor)->Unwatch(pair.here());
}

TEST(ReactorTest, UnwatchWaitsForARunningHandlerAndNoneRunsAfter) {
  StatusOr<std::unique_ptr<Reactor>> reactor = Reactor::Create();
  ASSERT_TRUE(reactor.ok());
  SocketPair pair;
  std::promise<void> entered;
  std::atomic<bool> finished{false};
  std::atomic<int> calls{0};
  ASSERT_TRUE((*reactor)
                  ->Watch(pair.here(), EPOLLIN,
                          [&](uint32_t) {
                            if (++calls > 1) return;
                            entered.set_value();
                            std::this_thread::sleep_for(milliseconds(50));
                            finished = true;
                          })
                  .ok());
  ASSERT_EQ(write(pair.there(), "x", 1), 1);  // never read: level-triggered, it fires again
  entered.get_future().wait();
  (*reactor)->Unwatch(pair.here());
  EXPECT_TRUE(finished.load()) << "Unwatch returned while the handler ran";
  const int after = calls.load();
  std::this_thread::sleep_for(milliseconds(20));
  EXPECT_EQ(calls.load(), after);
}

TEST(ReactorTest, PostedFunctionsRunOnTheReactorInOrder) {
  StatusOr<std::unique_ptr<Reactor>> reactor = Reactor::Create();
  ASSERT_TRUE(reactor.ok());
  std::vector<int> order;
  std::promise<void> done;
  for (int i = 0; i < 5; ++i) {
    (*reactor)->Post([&, i] {
      EXPECT_TRUE((*reactor)->OnReactorThread());
      order.push_back(i);
      if (i == 4) done.set_value();
    });
  }
  done.get_future().wait();
  EXPECT_EQ(order, (std::vector<int>{0, 1, 2, 3, 4}));
}

TEST(ReactorTest, UpdateSwitchesBetweenReadAndWriteInterest) {
  StatusOr<std::unique_ptr<Reactor>> reactor = Reactor::Create();
  ASSERT_TRUE(reactor.ok());
  SocketPair pair;
  std::promise<void> writable;
  std::atomic<bool> seen{false};
  ASSERT_TRUE((*reactor)
                  ->Watch(pair.here(), 0,
                          [&](uint32_t events) {
                            if ((events & EPOLLOUT) && !seen.exchange(true)) {
                              (*reactor)->Update(pair.here(), 0);
                              writable.set_value();
                            }
                          })
                  .ok());
  std::this_thread::sleep_for(milliseconds(10));
  EXPECT_FALSE(seen.load());
  (*reactor)->Update(pair.here(), EPOLLOUT);
  EXPECT_EQ(writable.get_future().wait_for(seconds(10)), std::future_status::ready);
  (*reactor)->Unwatch(pair.here());
}

}  // namespace
}  // namespace collectived
