#pragma once
// Where an engine's or a client's token comes from. A token on the command line is
// readable by every local user (/proc/PID/cmdline), so it may also come from the
// environment or from a file only its owner can read. Every executable and the Python
// agent resolve it through this one function.

#include <string>
#include <string_view>

#include "wire/result.h"

namespace shardscope::wire {

inline constexpr const char *kTokenEnv = "SHARDSCOPE_TOKEN";
inline constexpr const char *kTokenFileEnv = "SHARDSCOPE_TOKEN_FILE";

// The token, first found of: flagValue (--token), tokenFile (--token-file), the
// SHARDSCOPE_TOKEN variable, the file named by SHARDSCOPE_TOKEN_FILE; "" if none is set.
// Giving both flags is an error. A token file must be a regular file of the current
// user that neither group nor others can read (chmod 600); its first line, without
// surrounding whitespace, is the token and must not be empty.
Result<std::string> resolveToken(std::string_view flagValue, std::string_view tokenFile);

// Reads a token file with the checks above.
Result<std::string> readTokenFile(const std::string &path);

} // namespace shardscope::wire
