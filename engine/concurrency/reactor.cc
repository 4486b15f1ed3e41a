#include "engine/concurrency/reactor.h"

#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <string>
#include <vector>

#include "engine/vocabulary/errno_message.h"

namespace collectived {
namespace {

constexpr uint64_t kWakeId = 0;  // the eventfd's registration

}  // namespace

StatusOr<std::unique_ptr<Reactor>> Reactor::Create() {
  const int epoll_fd = epoll_create1(EPOLL_CLOEXEC);
  if (epoll_fd < 0)
    return Status::Internal("cannot start the socket reactor: " + ErrnoMessage("epoll"));
  const int wake_fd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  if (wake_fd < 0) {
    close(epoll_fd);
    return Status::Internal("cannot start the socket reactor: " + ErrnoMessage("eventfd"));
  }
  epoll_event event{};
  event.events = EPOLLIN;
  event.data.u64 = kWakeId;
  if (epoll_ctl(epoll_fd, EPOLL_CTL_ADD, wake_fd, &event) != 0) {
    const Status failed =
        Status::Internal("cannot start the socket reactor: " + ErrnoMessage("epoll_ctl"));
    close(wake_fd);
    close(epoll_fd);
    return failed;
  }
  return std::unique_ptr<Reactor>(new Reactor(epoll_fd, wake_fd));
}

Reactor::Reactor(int epoll_fd, int wake_fd) : epoll_fd_(epoll_fd), wake_fd_(wake_fd) {
  thread_ = std::thread([this] { Loop(); });
}

Reactor::~Reactor() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stopping_ = true;
  }
  Wake();
  thread_.join();
  close(wake_fd_);
  close(epoll_fd_);
}

void Reactor::Wake() {
  const uint64_t one = 1;
  // A full counter (never, in practice) already wakes the thread.
  (void)!write(wake_fd_, &one, sizeof(one));
}

Status Reactor::Watch(int fd, uint32_t events, Handler handler) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (id_of_fd_.count(fd)) return Status::Internal("descriptor watched twice by the reactor");
  const uint64_t id = next_id_++;
  epoll_event event{};
  event.events = events;
  event.data.u64 = id;
  if (epoll_ctl(epoll_fd_, EPOLL_CTL_ADD, fd, &event) != 0) {
    return Status::Internal("cannot watch a connection: " + ErrnoMessage("epoll_ctl"));
  }
  registrations_[id] = std::make_shared<Registration>(Registration{fd, std::move(handler)});
  id_of_fd_[fd] = id;
  return Status::Ok();
}

void Reactor::Update(int fd, uint32_t events) {
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = id_of_fd_.find(fd);
  if (it == id_of_fd_.end()) return;
  epoll_event event{};
  event.events = events;
  event.data.u64 = it->second;
  (void)epoll_ctl(epoll_fd_, EPOLL_CTL_MOD, fd, &event);
}

void Reactor::Unwatch(int fd) {
  std::unique_lock<std::mutex> lock(mutex_);
  auto it = id_of_fd_.find(fd);
  if (it == id_of_fd_.end()) return;
  const uint64_t id = it->second;
  id_of_fd_.erase(it);
  registrations_.erase(id);
  (void)epoll_ctl(epoll_fd_, EPOLL_CTL_DEL, fd, nullptr);
  if (OnReactorThread()) return;
  handler_done_.wait(lock, [&] { return running_ != id; });
}

void Reactor::Post(std::function<void()> fn) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    posted_.push_back(std::move(fn));
  }
  Wake();
}

void Reactor::Loop() {
  std::vector<epoll_event> events(64);
  for (;;) {
    const int ready = epoll_wait(epoll_fd_, events.data(), static_cast<int>(events.size()), -1);
    if (ready < 0 && errno != EINTR) return;  // the epoll descriptor is broken: nothing to serve
    for (int i = 0; i < std::max(ready, 0); ++i) {
      const uint64_t id = events[i].data.u64;
      if (id == kWakeId) {
        uint64_t count;
        (void)!read(wake_fd_, &count, sizeof(count));
        continue;
      }
      std::shared_ptr<Registration> registration;
      {
        std::lock_guard<std::mutex> lock(mutex_);
        auto it = registrations_.find(id);
        if (it == registrations_.end()) continue;  // unwatched since epoll_wait returned
        registration = it->second;
        running_ = id;
      }
      registration->handler(events[i].events);
      {
        std::lock_guard<std::mutex> lock(mutex_);
        running_ = 0;
      }
      handler_done_.notify_all();
    }
    std::deque<std::function<void()>> posted;
    bool stopping;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      posted.swap(posted_);
      stopping = stopping_;
    }
    for (auto& fn : posted) fn();
    if (stopping) return;
  }
}

}  // namespace collectived
