// auth.hpp: the control plane's credentials. A peer proves that it holds the job's token by an
// HMAC-SHA256, keyed with the token, over a fresh nonce of the other side and the facts of its
// message; the token itself never crosses the wire, and proofs are compared in constant time.
// The optional TLS files are checked before any connection uses them.
#pragma once

#include <cstddef>
#include <initializer_list>
#include <string>

namespace dist::runtime {

/// Random bytes in a nonce (hex-encoded: twice as many characters).
constexpr size_t nonce_bytes = 16;

/// A nonce from the operating system's random source, hex-encoded.
std::string fresh_nonce();

/// HMAC-SHA256 keyed with `token` over `parts` (each length-prefixed, so no two lists of parts
/// give the same bytes), hex-encoded.
std::string prove(const std::string& token, std::initializer_list<std::string> parts);

/// Whether two proofs are equal, in time that does not depend on where they differ.
bool same_proof(const std::string& a, const std::string& b);

/// A new job token: 32 random bytes, hex-encoded.
std::string fresh_token();

/// Whether the control plane's TLS files load as CAF's OpenSSL module will load them: a PEM
/// certificate chain, its private key (matching it), and the CA's certificates. "" when they
/// do, else which file fails and OpenSSL's reason.
std::string check_tls_files(const std::string& cert, const std::string& key, const std::string& ca);

} // namespace dist::runtime
