// auth.cpp: HMAC-SHA256 and random bytes from OpenSSL's libcrypto; the TLS files loaded as
// libssl loads them.
#include "actors/runtime/auth.hpp"

#include <openssl/crypto.h>
#include <openssl/err.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <openssl/rand.h>
#include <openssl/ssl.h>

#include <memory>
#include <stdexcept>
#include <vector>

namespace dist::runtime {

namespace {

std::string hex(const unsigned char* bytes, size_t n) {
    static const char digits[] = "0123456789abcdef";
    std::string out;
    out.reserve(2 * n);
    for (size_t i = 0; i < n; ++i) {
        out.push_back(digits[bytes[i] >> 4]);
        out.push_back(digits[bytes[i] & 15]);
    }
    return out;
}

std::string random_hex(size_t n) {
    std::vector<unsigned char> bytes(n);
    if (RAND_bytes(bytes.data(), static_cast<int>(n)) != 1)
        throw std::runtime_error("the random source failed (OpenSSL RAND_bytes)");
    return hex(bytes.data(), n);
}

} // namespace

std::string fresh_nonce() {
    return random_hex(nonce_bytes);
}

std::string fresh_token() {
    return random_hex(32);
}

std::string prove(const std::string& token, std::initializer_list<std::string> parts) {
    std::string message;
    for (const std::string& p : parts) {
        message += std::to_string(p.size());
        message += ':';
        message += p;
    }
    unsigned char mac[EVP_MAX_MD_SIZE];
    unsigned int len = 0;
    if (!HMAC(EVP_sha256(), token.data(), static_cast<int>(token.size()),
              reinterpret_cast<const unsigned char*>(message.data()), message.size(), mac, &len))
        throw std::runtime_error("HMAC-SHA256 failed (OpenSSL)");
    return hex(mac, len);
}

bool same_proof(const std::string& a, const std::string& b) {
    return a.size() == b.size() && CRYPTO_memcmp(a.data(), b.data(), a.size()) == 0;
}

std::string check_tls_files(const std::string& cert, const std::string& key,
                            const std::string& ca) {
    std::unique_ptr<SSL_CTX, decltype(&SSL_CTX_free)> ctx(SSL_CTX_new(TLS_method()), &SSL_CTX_free);
    if (!ctx) return "OpenSSL cannot make a TLS context";
    auto why = [](const std::string& what) {
        std::string reason = ERR_reason_error_string(ERR_peek_last_error())
                                 ? ERR_reason_error_string(ERR_peek_last_error())
                                 : "unknown reason";
        ERR_clear_error();
        return what + " (" + reason + ")";
    };
    if (SSL_CTX_use_certificate_chain_file(ctx.get(), cert.c_str()) != 1)
        return why("DIST_TLS_CERT: `" + cert + "` is not a PEM certificate chain");
    if (SSL_CTX_use_PrivateKey_file(ctx.get(), key.c_str(), SSL_FILETYPE_PEM) != 1 ||
        SSL_CTX_check_private_key(ctx.get()) != 1)
        return why("DIST_TLS_KEY: `" + key +
                   "` is not the PEM private key of the certificate in `" + cert + "`");
    if (SSL_CTX_load_verify_locations(ctx.get(), ca.c_str(), nullptr) != 1)
        return why("DIST_TLS_CA: `" + ca + "` holds no PEM CA certificate");
    return "";
}

} // namespace dist::runtime
