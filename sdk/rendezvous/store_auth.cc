#include "sdk/rendezvous/store_auth.h"

#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <openssl/rand.h>

namespace trainguard::store_auth {

absl::StatusOr<std::string> NewNonce() {
  std::string nonce(kNonceBytes, '\0');
  if (RAND_bytes(reinterpret_cast<unsigned char*>(nonce.data()), static_cast<int>(kNonceBytes)) !=
      1) {
    return absl::InternalError("RAND_bytes failed to produce a nonce for the store handshake");
  }
  return nonce;
}

std::string Proof(std::string_view token, Role role, std::string_view server_nonce,
                  std::string_view client_nonce, std::string_view job_id) {
  const std::string_view label =
      role == Role::kServer ? "trainguard-store-v1 server" : "trainguard-store-v1 client";
  // The nonces have a fixed length and the job id comes last, so the concatenation is unambiguous
  // given the label.
  std::string data;
  data.reserve(label.size() + 1 + server_nonce.size() + client_nonce.size() + job_id.size());
  data.append(label).push_back('\0');
  data.append(server_nonce).append(client_nonce).append(job_id);
  unsigned char mac[EVP_MAX_MD_SIZE];
  unsigned int mac_len = 0;
  HMAC(EVP_sha256(), token.data(), static_cast<int>(token.size()),
       reinterpret_cast<const unsigned char*>(data.data()), data.size(), mac, &mac_len);
  return std::string(reinterpret_cast<const char*>(mac), mac_len);
}

bool ProofMatches(std::string_view expected, std::string_view got) {
  if (expected.size() != got.size() || expected.empty()) return false;
  return CRYPTO_memcmp(expected.data(), got.data(), expected.size()) == 0;
}

}  // namespace trainguard::store_auth
