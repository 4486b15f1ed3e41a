#include "services/collectived/group_service.h"

#include <algorithm>
#include <chrono>
#include <memory>
#include <mutex>

#include "rpc/grpc_status.h"
#include "services/collectived/refusals.h"
#include "services/collectived/session_binding.h"

namespace collectived {
namespace {

constexpr std::chrono::milliseconds kCancellationCheckPeriod{100};

// gRPC's synchronous server tells a handler that its caller went away only when asked
// (ServerContext::IsCancelled): while a join waits for its other ranks, a timer asks every
// kCancellationCheckPeriod and cancels the join's token. The engine itself waits on the token,
// not on a clock; this is the one periodic check, confined to the front end that needs it.
class CancellationWatch {
 public:
  CancellationWatch(TimerQueue& timers, grpc::ServerContext* context,
                    std::shared_ptr<CancelToken> token)
      : state_(std::make_shared<State>()) {
    state_->timers = &timers;
    state_->context = context;
    state_->token = std::move(token);
    std::lock_guard<std::mutex> lock(state_->mutex);
    Arm(state_);
  }
  // No check runs after it returns (the context goes with the handler).
  ~CancellationWatch() {
    std::lock_guard<std::mutex> lock(state_->mutex);
    state_->context = nullptr;
    state_->timers->Cancel(state_->timer);
  }
  CancellationWatch(const CancellationWatch&) = delete;
  CancellationWatch& operator=(const CancellationWatch&) = delete;

 private:
  struct State {
    std::mutex mutex;
    TimerQueue* timers = nullptr;
    grpc::ServerContext* context = nullptr;  // guarded by mutex; null once the handler returns
    std::shared_ptr<CancelToken> token;
    TimerQueue::TimerId timer = TimerQueue::kNoTimer;  // guarded by mutex
  };

  static void Arm(const std::shared_ptr<State>& state) {
    state->timer = state->timers->ScheduleAfter(kCancellationCheckPeriod, [state] {
      std::lock_guard<std::mutex> lock(state->mutex);
      if (state->context == nullptr) return;
      if (!state->context->IsCancelled()) {
        Arm(state);
        return;
      }
      state->token->Cancel(Status::Aborted(
          "the client cancelled CreateGroup (it disconnected or its deadline passed)"));
    });
  }

  std::shared_ptr<State> state_;
};

}  // namespace

grpc::Status GroupService::CreateGroup(grpc::ServerContext* context,
                                       const v1::CreateGroupRequest* request,
                                       v1::CreateGroupResponse* response) {
  const SessionRef session{request->session_id(), SessionBinding(*context)};
  JoinRequest join;
  join.name = request->name();
  join.device = request->device_type() == v1::CUDA ? DeviceKind::kCuda : DeviceKind::kCpu;
  join.device_index = request->cuda_device();
  join.rank = request->rank();
  join.world_size = request->world_size();
  join.members.assign(request->members().begin(), request->members().end());
  join.store_prefix = request->store_prefix();
  // On the wire, timeout_ms 0 means the default join timeout.
  join.timeout = request->timeout_ms() == 0 ? kUseDefaultJoinTimeout
                                            : std::chrono::milliseconds(request->timeout_ms());
  join.job_token = request->job_token();
  if (request->fault_tolerance().mode() == v1::FaultTolerance::SHRINK) {
    join.fault_tolerance.mode = FaultToleranceMode::kShrink;
    join.fault_tolerance.min_ranks = std::max(1, request->fault_tolerance().min_ranks());
  }
  join.abandoned = std::make_shared<CancelToken>();
  CancellationWatch watch(sidecar_.runtime().timers(), context, join.abandoned);
  StatusOr<Membership> membership =
      sidecar_.JoinGroup(session, std::move(join), request->store_address());
  if (!membership.ok()) return Answer(metrics_, "Groups.CreateGroup", membership.status(), context);
  const Group& group = *membership->group;
  response->set_group(group.name());
  response->set_group_rank(membership->group_rank);
  response->set_group_size(group.topology().group_size);
  for (int member : group.spec().members) response->add_members(member);
  for (int rank : group.topology().local_ranks()) response->add_local_group_ranks(rank);
  response->set_num_sidecars(group.topology().node_count());
  response->set_sequence_number(membership->sequence_number);
  response->set_replacement(membership->replacement);
  response->set_epoch(group.spec().epoch);
  return grpc::Status::OK;
}

grpc::Status GroupService::Replacements(grpc::ServerContext* context,
                                        const v1::ReplacementsRequest* request,
                                        v1::ReplacementsResponse* response) {
  Sidecar::ReplacementAction action = Sidecar::ReplacementAction::kList;
  if (request->action() == v1::ReplacementsRequest::ACCEPT) {
    action = Sidecar::ReplacementAction::kAccept;
  } else if (request->action() == v1::ReplacementsRequest::ADMIT) {
    action = Sidecar::ReplacementAction::kAdmit;
  }
  StatusOr<Sidecar::ReplacementsAnswer> answer =
      sidecar_.Replacements(SessionRef{request->session_id(), SessionBinding(*context)},
                            request->group(), action, request->after_sequence_number(),
                            std::vector<int>(request->joiners().begin(), request->joiners().end()));
  if (!answer.ok()) return Answer(metrics_, "Groups.Replacements", answer.status(), context);
  for (int rank : answer->waiting) response->add_waiting(rank);
  response->set_epoch(answer->epoch);
  return grpc::Status::OK;
}

grpc::Status GroupService::DestroyGroup(grpc::ServerContext* context,
                                        const v1::DestroyGroupRequest* request,
                                        v1::DestroyGroupResponse*) {
  return Answer(metrics_, "Groups.DestroyGroup",
                sidecar_.DestroyGroup(SessionRef{request->session_id(), SessionBinding(*context)},
                                      request->group()),
                context);
}

}  // namespace collectived
