/* Mirror secrets at rest: AES-256-GCM under the key of mirror_secret_key_file, the config key's name as associated data. */
#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/rand.h>

#include "kmirror/secret.h"
#include "state/state_int.h"

static int hexval(int c)
{
	if (c >= '0' && c <= '9')
		return c - '0';
	c = tolower(c);
	return c >= 'a' && c <= 'f' ? c - 'a' + 10 : -1;
}

km_err km_state_key_load(const char *path, bool mode_check, uint8_t key[KM_STATE_KEY_BYTES], bool *loose_mode,
			 char *err, size_t errlen)
{
	uint8_t buf[80];
	size_t len;

	if (km_secret_file_read("mirror_secret_key_file", path, mode_check, buf, sizeof(buf), &len, loose_mode, err,
				errlen) != KM_OK)
		return KM_ERR_CONFIG;
	if (len == KM_STATE_KEY_BYTES) {
		memcpy(key, buf, KM_STATE_KEY_BYTES);
		OPENSSL_cleanse(buf, sizeof(buf));
		return KM_OK;
	}
	if (len > 0 && buf[len - 1] == '\n')
		len--;
	if (len > 0 && buf[len - 1] == '\r')
		len--;
	if (len == 2 * KM_STATE_KEY_BYTES) {
		bool ok = true;
		for (size_t i = 0; i < KM_STATE_KEY_BYTES && ok; i++) {
			int hi = hexval(buf[2 * i]), lo = hexval(buf[2 * i + 1]);
			ok = hi >= 0 && lo >= 0;
			key[i] = (uint8_t)(hi << 4 | lo);
		}
		OPENSSL_cleanse(buf, sizeof(buf));
		if (ok)
			return KM_OK;
	}
	OPENSSL_cleanse(buf, sizeof(buf));
	OPENSSL_cleanse(key, KM_STATE_KEY_BYTES);
	snprintf(err, errlen, "mirror_secret_key_file %s: not a key (32 raw bytes or 64 hex digits expected)", path);
	return KM_ERR_CONFIG;
}

km_err km_state_seal(const uint8_t key[KM_STATE_KEY_BYTES], const char *name, const char *clear, uint8_t **out,
		     size_t *outlen)
{
	size_t clen = strlen(clear);
	uint8_t *o;
	int l = 0, l2 = 0;
	km_err rc = KM_ERR_INVAL;
	EVP_CIPHER_CTX *ctx;

	if (clen > KM_STATE_MAX_VALUE)
		return KM_ERR_TOO_LARGE;
	o = malloc(KM_STATE_NONCE_BYTES + clen + KM_STATE_TAG_BYTES);
	ctx = EVP_CIPHER_CTX_new();
	if (!o || !ctx) {
		free(o);
		EVP_CIPHER_CTX_free(ctx);
		return KM_ERR_NOMEM;
	}
	if (RAND_bytes(o, KM_STATE_NONCE_BYTES) == 1 &&
	    EVP_EncryptInit_ex(ctx, EVP_aes_256_gcm(), NULL, NULL, NULL) == 1 &&
	    EVP_CIPHER_CTX_ctrl(ctx, EVP_CTRL_GCM_SET_IVLEN, KM_STATE_NONCE_BYTES, NULL) == 1 &&
	    EVP_EncryptInit_ex(ctx, NULL, NULL, key, o) == 1 &&
	    EVP_EncryptUpdate(ctx, NULL, &l, (const uint8_t *)name, (int)strlen(name)) == 1 &&
	    EVP_EncryptUpdate(ctx, o + KM_STATE_NONCE_BYTES, &l, (const uint8_t *)clear, (int)clen) == 1 &&
	    EVP_EncryptFinal_ex(ctx, o + KM_STATE_NONCE_BYTES + l, &l2) == 1 &&
	    EVP_CIPHER_CTX_ctrl(ctx, EVP_CTRL_GCM_GET_TAG, KM_STATE_TAG_BYTES, o + KM_STATE_NONCE_BYTES + clen) == 1 &&
	    (size_t)(l + l2) == clen) {
		*out = o;
		*outlen = KM_STATE_NONCE_BYTES + clen + KM_STATE_TAG_BYTES;
		rc = KM_OK;
	} else {
		free(o);
	}
	EVP_CIPHER_CTX_free(ctx);
	return rc;
}

km_err km_state_open(const uint8_t key[KM_STATE_KEY_BYTES], const char *name, const uint8_t *sealed, size_t len,
		     char *buf, size_t buflen)
{
	size_t clen;
	int l = 0, l2 = 0;
	km_err rc = KM_ERR_DECODE;
	EVP_CIPHER_CTX *ctx;
	uint8_t tag[KM_STATE_TAG_BYTES];

	if (len < KM_STATE_NONCE_BYTES + KM_STATE_TAG_BYTES)
		return KM_ERR_DECODE;
	clen = len - KM_STATE_NONCE_BYTES - KM_STATE_TAG_BYTES;
	if (clen + 1 > buflen)
		return KM_ERR_TOO_LARGE;
	memcpy(tag, sealed + KM_STATE_NONCE_BYTES + clen, KM_STATE_TAG_BYTES);
	ctx = EVP_CIPHER_CTX_new();
	if (!ctx)
		return KM_ERR_NOMEM;
	if (EVP_DecryptInit_ex(ctx, EVP_aes_256_gcm(), NULL, NULL, NULL) == 1 &&
	    EVP_CIPHER_CTX_ctrl(ctx, EVP_CTRL_GCM_SET_IVLEN, KM_STATE_NONCE_BYTES, NULL) == 1 &&
	    EVP_DecryptInit_ex(ctx, NULL, NULL, key, sealed) == 1 &&
	    EVP_DecryptUpdate(ctx, NULL, &l, (const uint8_t *)name, (int)strlen(name)) == 1 &&
	    EVP_DecryptUpdate(ctx, (uint8_t *)buf, &l, sealed + KM_STATE_NONCE_BYTES, (int)clen) == 1 &&
	    EVP_CIPHER_CTX_ctrl(ctx, EVP_CTRL_GCM_SET_TAG, KM_STATE_TAG_BYTES, tag) == 1 &&
	    EVP_DecryptFinal_ex(ctx, (uint8_t *)buf + l, &l2) == 1 && (size_t)(l + l2) == clen) {
		buf[clen] = 0;
		rc = KM_OK;
	} else {
		OPENSSL_cleanse(buf, buflen);
	}
	EVP_CIPHER_CTX_free(ctx);
	return rc;
}
