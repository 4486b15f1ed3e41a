// Build-time facts about this collectived binary.
#pragma once

namespace collectived {

inline constexpr char kVersion[] = COLLECTIVED_VERSION;
#ifdef COLLECTIVED_WITH_NCCL
inline constexpr bool kNcclAvailable = true;
#else
inline constexpr bool kNcclAvailable = false;
#endif
inline constexpr bool kGlooAvailable = true;

}  // namespace collectived
