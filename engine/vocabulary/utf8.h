// UTF-8 hygiene for text that quotes what clients sent: error messages carry group names, keys
// and store values, which are arbitrary bytes, but a gRPC status message and a proto string must
// be UTF-8 (clients refuse to decode them otherwise).
#pragma once

#include <string>
#include <string_view>

namespace collectived {

// `text` with every byte that is not part of a well-formed UTF-8 character written as "\xNN".
// Messages quote what requests carried (store values are raw bytes), but a gRPC status message
// and a proto string must be UTF-8: clients refuse to decode them otherwise.
std::string ValidUtf8(std::string_view text);

}  // namespace collectived
