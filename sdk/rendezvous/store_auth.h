// The mutual challenge-response of the TcpStore handshake. Both sides send 32 random bytes; each
// then proves that it knows the job token with HMAC-SHA256(token, label | server nonce | client
// nonce | job id), where the label differs for the two roles so that one side's proof can never be
// replayed as the other's. The token itself never crosses the network.
//
// Thread safety: every function here may be called concurrently.
#ifndef TRAINGUARD_SDK_RENDEZVOUS_STORE_AUTH_H_
#define TRAINGUARD_SDK_RENDEZVOUS_STORE_AUTH_H_

#include <cstddef>
#include <string>
#include <string_view>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace trainguard::store_auth {

inline constexpr size_t kNonceBytes = 32;
inline constexpr size_t kProofBytes = 32;

enum class Role { kServer, kClient };

// kNonceBytes from the operating system's CSPRNG (OpenSSL RAND_bytes). Internal when it fails.
absl::StatusOr<std::string> NewNonce();

// The proof of `role`: kProofBytes of HMAC-SHA256.
std::string Proof(std::string_view token, Role role, std::string_view server_nonce,
                  std::string_view client_nonce, std::string_view job_id);

// Whether `got` equals `expected`, in time independent of where they differ.
bool ProofMatches(std::string_view expected, std::string_view got);

}  // namespace trainguard::store_auth

#endif  // TRAINGUARD_SDK_RENDEZVOUS_STORE_AUTH_H_
