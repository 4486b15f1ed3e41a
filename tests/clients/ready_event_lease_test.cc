// The trainer's ready-event leases without a GPU (taking and giving back a lease touches no
// device; recording one does): ReadyEventLease gives its slot back when it goes, once, and moves
// without giving it back; OpReadyLeases holds one lease per device and stream of an op; a
// failed export keeps no lease of its own, and one it was given stays with the caller. In a
// build without CUDA there is nothing to lease, which is checked instead.
#include <gtest/gtest.h>

#include <utility>
#include <vector>

#include "clients/cpp/cuda_tensor_export.h"

namespace collectived {
namespace {

constexpr int kDevice = 0;

TEST(ReadyEventLeaseTest, ALeaseGoesBackOnceWhenItGoesAndMovesWithoutGoingBack) {
  if (!ClientHasCuda()) {
    EXPECT_FALSE(LeaseReadyEvent(kDevice).ok()) << "a lease without CUDA";
    GTEST_SKIP() << "built without CUDA: no ready events to lease";
  }
  const size_t before = LeasedReadyEvents(kDevice);
  {
    StatusOr<ReadyEventLease> first = LeaseReadyEvent(kDevice);
    ASSERT_TRUE(first.ok()) << first.status().ToString();
    EXPECT_TRUE(first->held());
    EXPECT_EQ(LeasedReadyEvents(kDevice), before + 1);
    ReadyEventLease moved = std::move(*first);
    EXPECT_FALSE(first->held());
    EXPECT_EQ(LeasedReadyEvents(kDevice), before + 1) << "the move gave the lease back";
    std::vector<ReadyEventLease> kept;
    kept.push_back(std::move(moved));
    StatusOr<ReadyEventLease> second = LeaseReadyEvent(kDevice);
    ASSERT_TRUE(second.ok());
    EXPECT_NE(second->slot(), kept[0].slot()) << "one slot leased twice";
    EXPECT_EQ(LeasedReadyEvents(kDevice), before + 2);
    second->Reset();
    second->Reset();
    EXPECT_EQ(LeasedReadyEvents(kDevice), before + 1);
  }
  EXPECT_EQ(LeasedReadyEvents(kDevice), before) << "a lease outlived its holder";
}

TEST(ReadyEventLeaseTest, AnOpHoldsOneLeasePerDeviceAndStream) {
  if (!ClientHasCuda()) GTEST_SKIP() << "built without CUDA: no ready events to lease";
  const size_t before = LeasedReadyEvents(kDevice);
  int streams[2];
  {
    OpReadyLeases leases;
    EXPECT_TRUE(leases.empty());
    ASSERT_TRUE(leases.TakeFor(kDevice, &streams[0]).ok());
    ASSERT_TRUE(leases.TakeFor(kDevice, &streams[0]).ok());  // a second tensor, same stream
    EXPECT_EQ(LeasedReadyEvents(kDevice), before + 1);
    ASSERT_TRUE(leases.TakeFor(kDevice, &streams[1]).ok());
    EXPECT_EQ(LeasedReadyEvents(kDevice), before + 2);
    EXPECT_NE(leases.For(kDevice, &streams[0])->slot(), leases.For(kDevice, &streams[1])->slot());
    OpReadyLeases handed = std::move(leases);
    EXPECT_EQ(LeasedReadyEvents(kDevice), before + 2);
    handed.Clear();
    EXPECT_EQ(LeasedReadyEvents(kDevice), before);
  }
  EXPECT_EQ(LeasedReadyEvents(kDevice), before);
}

TEST(ReadyEventLeaseTest, AFailedExportKeepsNoLeaseOfItsOwnAndLeavesTheCallersHeld) {
  if (!ClientHasCuda()) GTEST_SKIP() << "built without CUDA: no ready events to lease";
  const size_t before = LeasedReadyEvents(kDevice);
  float host[4] = {};
  // Host memory, or no driver here: the export fails either way, before or at the recording.
  ReadyEventLease taken_by_export;
  EXPECT_FALSE(
      ExportCudaTensor(host, sizeof(host), kDevice, nullptr, nullptr, &taken_by_export).ok());
  EXPECT_FALSE(taken_by_export.held());
  EXPECT_EQ(LeasedReadyEvents(kDevice), before) << "a failed export kept a lease";

  StatusOr<ReadyEventLease> given = LeaseReadyEvent(kDevice);
  ASSERT_TRUE(given.ok());
  const size_t slot = given->slot();
  EXPECT_FALSE(ExportCudaTensor(host, sizeof(host), kDevice, nullptr, nullptr, &*given).ok());
  EXPECT_TRUE(given->held());
  EXPECT_EQ(given->slot(), slot);
  EXPECT_EQ(LeasedReadyEvents(kDevice), before + 1);
}

}  // namespace
}  // namespace collectived
