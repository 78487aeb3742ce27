/* tls.c -- the PostgreSQL proxy's TLS (pg.h, "TLS"): a server context from PEM files, OpenSSL */
#include <errno.h>
#include <openssl/err.h>
#include <openssl/ssl.h>
#include <openssl/x509.h>
#include <string.h>

#include "pg.h"

/* OpenSSL's last error as text into buf. */
static const char *ssl_reason(char *buf, size_t len) {
  unsigned long e = ERR_get_error();
  if (!e)
    return "unknown error";
  ERR_error_string_n(e, buf, len);
  ERR_clear_error();
  return buf;
}

SSL_CTX *pg_tls_context(const char *cert, const char *key, moat_error **err) {
  char why[256];
  if (!cert || !key)
    return moat_error_set(err, EINVAL, "TLS needs both a certificate and its key"), NULL;
  SSL_CTX *ctx = SSL_CTX_new(TLS_server_method());
  if (!ctx)
    return moat_error_set(err, ENOMEM, "TLS: %s", ssl_reason(why, sizeof(why))), NULL;
  SSL_CTX_set_min_proto_version(ctx, TLS1_2_VERSION);
  SSL_CTX_set_options(ctx, SSL_OP_NO_COMPRESSION | SSL_OP_NO_RENEGOTIATION | SSL_OP_CIPHER_SERVER_PREFERENCE);
  SSL_CTX_set_mode(ctx, SSL_MODE_ENABLE_PARTIAL_WRITE | SSL_MODE_ACCEPT_MOVING_WRITE_BUFFER);
  SSL_CTX_set_session_cache_mode(ctx, SSL_SESS_CACHE_OFF);
  if (SSL_CTX_use_certificate_chain_file(ctx, cert) != 1) {
    moat_error_set(err, EINVAL, "TLS certificate %s: %s", cert, ssl_reason(why, sizeof(why)));
    SSL_CTX_free(ctx);
    return NULL;
  }
  if (SSL_CTX_use_PrivateKey_file(ctx, key, SSL_FILETYPE_PEM) != 1) {
    if (ERR_GET_REASON(ERR_peek_last_error()) == X509_R_KEY_VALUES_MISMATCH) {
      ERR_clear_error();
      moat_error_set(err, EINVAL, "TLS key %s does not belong to certificate %s", key, cert);
    } else {
      moat_error_set(err, EINVAL, "TLS key %s: %s", key, ssl_reason(why, sizeof(why)));
    }
    SSL_CTX_free(ctx);
    return NULL;
  }
  if (SSL_CTX_check_private_key(ctx) != 1) {
    moat_error_set(err, EINVAL, "TLS key %s does not belong to certificate %s", key, cert);
    SSL_CTX_free(ctx);
    return NULL;
  }
  return ctx;
}
