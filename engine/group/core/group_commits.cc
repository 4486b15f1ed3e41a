// Group: committing groups, which survive the loss of a peer sidecar (docs/fault-tolerance.md,
// losing a sidecar). An op's data phase keeps a copy of what it overwrites, and its works complete
// only once every sidecar finished that data phase (the commit: a one-byte combine over the
// control channel). After a loss the group freezes where it is; the registry takes the lowest
// point every survivor's data phases reached as the cut, and the group hands out the ops up to it
// and gives the later ones their inputs back to run again in the next epoch. Apart from the
// pipeline (group.cc), which only calls KeepOutputs and Commit. On an asynchronous (device) backend
// the copy is on the device and the commit follows the device's completion of the op.
#include <algorithm>
#include <cstring>
#include <utility>
#include <vector>

#include "engine/group/core/group.h"
#include "engine/group/core/group_internal.h"
#include "engine/vocabulary/op_traits.h"

namespace collectived {
namespace {

// What the data phase of `op` writes: the outputs of its local ranks, and the inputs of an op
// that works in place (op_traits.h).
template <typename Visit>
void ForEachOutput(PendingOp& op, Visit visit) {
  for (auto& request : op.requests) {
    if (!request) continue;
    const bool in_place = TraitsOf(request->kind).in_place;
    for (const auto* tensors : {&request->inputs, &request->outputs}) {
      if (tensors == &request->inputs && !in_place) continue;
      for (const TensorView& tensor : *tensors) {
        if (tensor.data != nullptr && tensor.bytes() > 0) visit(tensor);
      }
    }
  }
}

}  // namespace

Status Group::KeepOutputs(StartedOp& started) {
  started.kept.clear();
  started.kept_on_device = nullptr;
  if (capabilities_.asynchronous) {
    // On the device, copied on the stream after the tensors' ready events and before the
    // algorithm writes them; one buffer, as the group runs one op at a time.
    size_t bytes = 0;
    ForEachOutput(started.op, [&](const TensorView& tensor) { bytes += tensor.bytes(); });
    if (bytes == 0) return Status::Ok();
    StatusOr<std::byte*> kept = data_->KeptMemory(bytes);
    if (!kept.ok()) return kept.status().WithContext("keeping the op's outputs for a re-run");
    size_t offset = 0;
    Status copied;
    ForEachOutput(started.op, [&](const TensorView& tensor) {
      if (copied.ok()) copied = data_->Copy(*kept + offset, tensor.data, tensor.bytes());
      offset += tensor.bytes();
    });
    if (copied.ok()) started.kept_on_device = *kept;
    return copied;
  }
  // Client memory is guarded (MappingFaultGuard): a client that shrank it reads as zeros here
  // and its op fails in the data phase, as it would without the copy.
  ForEachOutput(started.op, [&](const TensorView& tensor) {
    started.kept.emplace_back(tensor.data, tensor.data + tensor.bytes());
  });
  return Status::Ok();
}

Status Group::RestoreOutputs(StartedOp& started) {
  if (started.kept_on_device != nullptr) {
    size_t offset = 0;
    Status restored;
    ForEachOutput(started.op, [&](const TensorView& tensor) {
      if (restored.ok()) {
        restored = data_->RestoreKept(tensor.data, started.kept_on_device + offset, tensor.bytes());
      }
      offset += tensor.bytes();
    });
    return restored;
  }
  size_t next = 0;
  ForEachOutput(started.op, [&](const TensorView& tensor) {
    if (next >= started.kept.size()) return;
    const std::vector<std::byte>& kept = started.kept[next++];
    if (kept.size() == tensor.bytes()) std::memcpy(tensor.data, kept.data(), kept.size());
  });
  return Status::Ok();
}

void Group::Commit(StartedOp& started) {
  Status frozen;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    started.data_finished = true;
    if (freezing_) frozen = freezing_->why;
  }
  if (!frozen.ok()) {
    FinishOp(started, frozen);  // held for the cut
    return;
  }
  // Every sidecar sends its byte only once its data phase finished: the combine completes on
  // one sidecar only when it did on all (a sidecar that hands an op out knows every survivor can).
  control_->StartAllReduce(
      &started.commit_in, &started.commit_out, 1,
      [](std::byte* acc, const std::byte* later) { *acc &= *later; },
      OpTags(started.op.sequence_number).Control<OpTags::kCommit>(),
      [this, &started](const Status& status) {
        if (status.ok()) {
          FinishOp(started, status);
          return;
        }
        runtime_.executor().Post([this, &started, status] {
          FinishOp(started, PeerError(status, Describe(started.op)));
        });
      });
}

std::optional<Status> Group::FreezeOnLostSidecars(const Status& status, const std::string& where) {
  std::vector<int> lost;
  Status named = NameLostPeers(status, &lost);
  if (lost.empty()) return std::nullopt;  // every peer answered: not a loss the group survives
  named = named.WithContextOnce("group '" + spec_.name + "'");
  if (BeginFreeze(named)) hooks_.sidecars_lost(lost, named);
  return failure().ok() ? named.WithContextOnce(where) : failure().WithContextOnce(where);
}

bool Group::BeginFreeze(const Status& why) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (freezing_ || !failure_.ok()) return false;
    freezing_ = Freezing{nullptr, false, why};
  }
  // Nothing of this epoch finishes any more: a peer blocked in a transfer with this sidecar, or
  // in an exchange, notices now rather than at its deadline. The next epoch has connections of
  // its own.
  point_to_point_.FailAll(Status::Aborted("epoch " + std::to_string(spec_.epoch) + " of group '" +
                                          spec_.name + "' ended: " + why.message()));
  control_->Close();
  data_->Abort();
  return true;
}

void Group::Freeze(FrozenCallback frozen) {
  (void)BeginFreeze(Status::PeerLost("a peer sidecar of group '" + spec_.name + "' was lost"));
  Status failed;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (!failure_.ok() || !freezing_) {
      failed = failure_;
    } else if (!freezing_->reported && !freezing_->frozen) {
      freezing_->frozen = std::move(frozen);
    }
  }
  if (!failed.ok()) {
    if (frozen) frozen(failed, 0);
    return;
  }
  MaybeReportFrozen();
}

void Group::MaybeReportFrozen() {
  FrozenCallback frozen;
  uint64_t finished_through = 0;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (!freezing_ || freezing_->reported || !freezing_->frozen || !failure_.ok()) return;
    finished_through = concluded_through_;
    for (const auto& started : started_) {
      // An agreed op waiting for the data slot is in no flow; any other one still runs.
      if (!started->outcome && !started->held && started->phase != Phase::kAgreed) return;
      if (started->data_finished) {
        finished_through = std::max(finished_through, started->op.sequence_number);
      }
    }
    freezing_->reported = true;
    frozen = std::move(freezing_->frozen);
  }
  frozen(Status::Ok(), finished_through);
}

void Group::RetireFrozen(uint64_t cut, RetiredCallback retired) {
  std::vector<std::pair<PendingOp, Status>> concluded;
  std::vector<TakenBack> taken;
  Status failed;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (!failure_.ok()) {
      failed = failure_;
    } else if (retirement_ && retirement_->done) {
      return;
    } else {
      retirement_ = Retirement{cut, nullptr, /*done=*/true};
      for (const auto& started : started_) {
        if (started->outcome) continue;
        PendingOp& op = started->op;
        if (started->data_finished && op.sequence_number <= cut) {
          started->outcome = Status::Ok();  // every survivor finished it: handed out
          continue;
        }
        // Its data phase may have run here (not everywhere): it runs again from its input. Its
        // flow ended (held) or never began (agreed); it stays until the group stops, with
        // nothing left to complete (the works and stream signals go with the copy taken back).
        if (Status restored = RestoreOutputs(*started); !restored.ok()) {
          // Its outputs are neither the result nor the input: it cannot run again.
          started->outcome = restored.WithContext("restoring the op's input for a re-run");
          continue;
        }
        started->held = true;
        taken.push_back(TakeBackLocked(*started));
      }
      PopEndedLocked(concluded);
      TakeBackPendingLocked(taken);
    }
  }
  if (!failed.ok()) {
    if (retired) retired(failed, {});
    return;
  }
  for (auto& [op, result] : concluded) Conclude(op, result);
  if (retired) retired(Status::Ok(), std::move(taken));
}

}  // namespace collectived
