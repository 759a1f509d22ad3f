// The inline-token table's encoding, shared by its writer (inline_tokens.cpp) and its reader (lookup.cpp).
#pragma once

#include <cstdint>

namespace tscale {

// an entry for a suffix with no token at offset 2 (tscale.ops.index.INLINE_END; never a token id)
constexpr uint16_t kInlineEnd = 0xFFFF;

// the token an entry holds, -1 past the shard's end (the order index_lookup compares in)
inline int64_t inline_token(uint16_t entry) { return entry == kInlineEnd ? -1 : static_cast<int64_t>(entry); }

}  // namespace tscale
