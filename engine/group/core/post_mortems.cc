#include "engine/group/core/post_mortems.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>

#include "engine/vocabulary/logging.h"
#include "engine/vocabulary/op.h"

namespace collectived {
namespace {

void AppendJsonString(std::string& out, std::string_view text) {
  out += '"';
  for (unsigned char c : text) {
    switch (c) {
      case '"':
        out += "\\\"";
        break;
      case '\\':
        out += "\\\\";
        break;
      case '\n':
        out += "\\n";
        break;
      case '\r':
        out += "\\r";
        break;
      case '\t':
        out += "\\t";
        break;
      default:
        if (c < 0x20) {
          char escaped[8];
          std::snprintf(escaped, sizeof(escaped), "\\u%04x", c);
          out += escaped;
        } else {
          out += static_cast<char>(c);
        }
    }
  }
  out += '"';
}

template <typename T>
void AppendJsonArray(std::string& out, const std::vector<T>& values) {
  out += '[';
  for (size_t i = 0; i < values.size(); ++i) {
    if (i > 0) out += ',';
    if constexpr (std::is_same_v<T, std::string>) {
      AppendJsonString(out, values[i]);
    } else {
      out += std::to_string(values[i]);
    }
  }
  out += ']';
}

int64_t UnixMicros(std::chrono::system_clock::time_point t) {
  return std::chrono::duration_cast<std::chrono::microseconds>(t.time_since_epoch()).count();
}

// Letters, digits, '.', '_' and '-' kept; anything else (a '/' of a sidecar id) becomes '_'.
std::string FileSafe(std::string_view text) {
  std::string safe(text.substr(0, 100));
  for (char& c : safe) {
    const bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
                    c == '.' || c == '_' || c == '-';
    if (!ok) c = '_';
  }
  return safe;
}

std::string JoinRanks(const std::vector<int>& ranks) {
  std::string text;
  for (int rank : ranks) text += (text.empty() ? "" : ",") + std::to_string(rank);
  return text.empty() ? "none known" : text;
}

}  // namespace

std::vector<int> PostMortem::RanksNotArrived(const OpRecord& record) {
  std::vector<int> ranks;
  // Agreed, so every rank arrived, though a sidecar of a group agreeing through summaries knows
  // the arrival of few of them.
  if (record.data_started_us >= 0) return ranks;
  const std::vector<int64_t> arrivals = record.RankArrivalUs();
  for (size_t rank = 0; rank < arrivals.size(); ++rank) {
    if (arrivals[rank] < 0) ranks.push_back(static_cast<int>(rank));
  }
  if (arrivals.empty()) ranks = record.missing_ranks;
  return ranks;
}

bool PostMortem::Caught(const OpRecord& record) const {
  return record.InFlight() ||
         (record.state == OpRecord::State::kFailed && record.status.kind() == failure.kind());
}

std::string PostMortemJson(const PostMortem& p) {
  std::string out = "{\"format\":\"collectived.post_mortem.v1\",\"group\":";
  AppendJsonString(out, p.group);
  out += ",\"sidecar\":";
  AppendJsonString(out, p.sidecar_id);
  out += ",\"device\":";
  AppendJsonString(out, p.device);
  out += ",\"failed_unix_us\":" + std::to_string(UnixMicros(p.failed_at));
  out += ",\"failure\":{\"kind\":";
  AppendJsonString(out, ErrorKindName(p.failure.kind()));
  out += ",\"message\":";
  AppendJsonString(out, p.failure.message());
  out += "},\"members\":";
  AppendJsonArray(out, p.members);
  out += ",\"sidecar_of_rank\":";
  AppendJsonArray(out, p.sidecar_of_rank);
  out += ",\"address_of_rank\":";
  AppendJsonArray(out, p.address_of_rank);
  out += ",\"local_group_ranks\":";
  AppendJsonArray(out, p.local_group_ranks);
  out += ",\"sequence_number\":" + std::to_string(p.sequence_number);
  out += ",\"ops\":[";
  for (size_t i = 0; i < p.records.size(); ++i) {
    const OpRecord& r = p.records[i];
    if (i > 0) out += ',';
    out += "{\"sequence_number\":" + std::to_string(r.sequence_number) + ",\"op\":";
    AppendJsonString(out, OpKindName(r.kind));
    out += ",\"state\":";
    AppendJsonString(out, OpStateName(r.state));
    out += ",\"dtype\":";
    AppendJsonString(out, DTypeName(r.dtype));
    out += ",\"count\":" + std::to_string(r.count) + ",\"bytes\":" + std::to_string(r.bytes);
    out += ",\"issued_unix_us\":" + std::to_string(UnixMicros(r.issued));
    out += ",\"duration_us\":" + std::to_string(r.duration.count());
    out += ",\"rank_arrival_us\":";
    AppendJsonArray(out, r.RankArrivalUs());
    out += ",\"ranks_not_arrived\":";
    AppendJsonArray(out, p.Caught(r) ? PostMortem::RanksNotArrived(r) : std::vector<int>{});
    out += ",\"error\":";
    if (r.status.ok()) {
      out += "null";
    } else {
      out += "{\"kind\":";
      AppendJsonString(out, ErrorKindName(r.status.kind()));
      out += ",\"message\":";
      AppendJsonString(out, r.status.message());
      out += "}";
    }
    out += "}";
  }
  out += "]}\n";
  return out;
}

PostMortems::PostMortems(size_t keep, std::string directory)
    : keep_(keep), directory_(std::move(directory)) {}

void PostMortems::Record(PostMortem post_mortem) {
  // Once per group failure on each sidecar: what failed, and what each op in flight waited for.
  LogWarning("group failed",
             {{"group", post_mortem.group},
              {"kind", std::string(ErrorKindName(post_mortem.failure.kind()))},
              {"error", post_mortem.failure.message()},
              {"last_sequence_number", std::to_string(post_mortem.sequence_number)}});
  for (const OpRecord& record : post_mortem.records) {
    if (!post_mortem.Caught(record)) continue;
    LogWarning("op failed with its group",
               {{"group", post_mortem.group},
                {"op", std::string(OpKindName(record.kind))},
                {"sequence_number", std::to_string(record.sequence_number)},
                {"state", std::string(OpStateName(record.state))},
                {"ranks_not_arrived", JoinRanks(PostMortem::RanksNotArrived(record))}});
  }
  if (!directory_.empty()) {
    const std::string path = directory_ + "/" + FileSafe(post_mortem.group) + "." +
                             FileSafe(post_mortem.sidecar_id) + "." +
                             std::to_string(std::chrono::duration_cast<std::chrono::milliseconds>(
                                                post_mortem.failed_at.time_since_epoch())
                                                .count()) +
                             ".json";
    const std::string json = PostMortemJson(post_mortem);
    // Written whole under a temporary name, then renamed: a reader never sees half a file.
    const std::string temporary = path + ".tmp";
    const int fd = open(temporary.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0640);
    bool written =
        fd >= 0 && write(fd, json.data(), json.size()) == static_cast<ssize_t>(json.size());
    const int error = errno;
    if (fd >= 0) close(fd);
    if (written) written = std::rename(temporary.c_str(), path.c_str()) == 0;
    if (!written) {
      (void)std::remove(temporary.c_str());
      LogWarning("cannot write the post-mortem of a failed group",
                 {{"group", post_mortem.group}, {"path", path}, {"error", std::strerror(error)}});
    }
  }
  if (keep_ == 0) return;
  std::lock_guard<std::mutex> lock(mutex_);
  kept_.push_back(std::move(post_mortem));
  while (kept_.size() > keep_) kept_.pop_front();
}

std::optional<PostMortem> PostMortems::Find(const std::string& group) const {
  std::lock_guard<std::mutex> lock(mutex_);
  for (auto it = kept_.rbegin(); it != kept_.rend(); ++it) {
    if (it->group == group) return *it;
  }
  return std::nullopt;
}

std::vector<PostMortem> PostMortems::List() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return {kept_.begin(), kept_.end()};
}

}  // namespace collectived
