#include "engine/group/transport/gloo/gloo_errors.h"

#include <gloo/common/error.h>
#include <gloo/common/logging.h>

#include <exception>
#include <string>

namespace collectived {
namespace {

bool SaysTimedOut(std::string_view text) {
  return text.find("Timed out") != std::string_view::npos ||
         text.find("timed out") != std::string_view::npos;
}

}  // namespace

Status StatusFromGloo(std::string_view what) {
  const std::string where(what);
  try {
    throw;
  } catch (const gloo::InvalidOperationException& error) {
    return Status::Internal(where + ": Gloo refused the operation: " + error.what());
  } catch (const gloo::EnforceNotMet& error) {
    return Status::Internal(where + ": Gloo check failed: " + error.what());
  } catch (const std::exception& error) {
    // gloo::IoException, and anything else: a timeout marked only by its text, else a broken
    // connection.
    if (SaysTimedOut(error.what()))
      return Status::Timeout("Timeout in " + where + ": Timed out (Gloo: " + error.what() + ")");
    return Status::PeerLost(where + ": " + error.what());
  } catch (...) {
    return Status::Internal(where + ": unknown exception from Gloo");
  }
}

}  // namespace collectived
