/*
 * Mirror secrets at rest: AES-256-GCM under the key of mirror_secret_key_file. A sealed value
 * carries its format version; the associated data binds it to its mirror and configuration key.
 */
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

km_err km_state_key_check(const char *path, bool mode_check, char *err, size_t errlen)
{
	uint8_t key[KM_STATE_KEY_BYTES];
	bool loose = false;
	km_err rc = km_state_key_load(path, mode_check, key, &loose, err, errlen);

	OPENSSL_cleanse(key, sizeof(key));
	return rc;
}

/*
 * The associated data of a value of format 1: the version byte, then the mirror's name and the
 * key's name, each after its length (two bytes, big-endian), so that no two pairs of names give the
 * same bytes. GCM takes it in pieces, before the text.
 */
static bool aad_v1(EVP_CIPHER_CTX *ctx, bool enc, const char *mirror, const char *name)
{
	const char *part[2] = {mirror, name};
	uint8_t v = KM_STATE_SEAL_V1;
	int l;

	if ((enc ? EVP_EncryptUpdate : EVP_DecryptUpdate)(ctx, NULL, &l, &v, 1) != 1)
		return false;
	for (int i = 0; i < 2; i++) {
		size_t n = strlen(part[i]);
		uint8_t be[2] = {(uint8_t)(n >> 8), (uint8_t)n};
		if (n > 0xffff || (enc ? EVP_EncryptUpdate : EVP_DecryptUpdate)(ctx, NULL, &l, be, 2) != 1 ||
		    (n && (enc ? EVP_EncryptUpdate : EVP_DecryptUpdate)(ctx, NULL, &l, (const uint8_t *)part[i],
									  (int)n) != 1))
			return false;
	}
	return true;
}

km_err km_state_seal(const uint8_t key[KM_STATE_KEY_BYTES], const char *mirror, const char *name, const char *clear,
		     uint8_t **out, size_t *outlen)
{
	size_t clen = strlen(clear);
	uint8_t *o, *nonce, *ct;
	int l = 0, l2 = 0;
	km_err rc = KM_ERR_INVAL;
	EVP_CIPHER_CTX *ctx;

	if (clen > KM_STATE_MAX_VALUE)
		return KM_ERR_TOO_LARGE;
	o = malloc(KM_STATE_SEAL_OVERHEAD + clen);
	ctx = EVP_CIPHER_CTX_new();
	if (!o || !ctx) {
		free(o);
		EVP_CIPHER_CTX_free(ctx);
		return KM_ERR_NOMEM;
	}
	o[0] = KM_STATE_SEAL_V1;
	nonce = o + 1;
	ct = nonce + KM_STATE_NONCE_BYTES;
	if (RAND_bytes(nonce, KM_STATE_NONCE_BYTES) == 1 &&
	    EVP_EncryptInit_ex(ctx, EVP_aes_256_gcm(), NULL, NULL, NULL) == 1 &&
	    EVP_CIPHER_CTX_ctrl(ctx, EVP_CTRL_GCM_SET_IVLEN, KM_STATE_NONCE_BYTES, NULL) == 1 &&
	    EVP_EncryptInit_ex(ctx, NULL, NULL, key, nonce) == 1 && aad_v1(ctx, true, mirror, name) &&
	    EVP_EncryptUpdate(ctx, ct, &l, (const uint8_t *)clear, (int)clen) == 1 &&
	    EVP_EncryptFinal_ex(ctx, ct + l, &l2) == 1 &&
	    EVP_CIPHER_CTX_ctrl(ctx, EVP_CTRL_GCM_GET_TAG, KM_STATE_TAG_BYTES, ct + clen) == 1 &&
	    (size_t)(l + l2) == clen) {
		*out = o;
		*outlen = KM_STATE_SEAL_OVERHEAD + clen;
		rc = KM_OK;
	} else {
		free(o);
	}
	EVP_CIPHER_CTX_free(ctx);
	return rc;
}

/*
 * One attempt at opening nonce + ciphertext + tag (clen bytes of text) with the associated data of
 * format 1 (mirror set) or of format 0 (the key's name alone). buf is wiped on failure.
 */
static km_err open_as(const uint8_t key[KM_STATE_KEY_BYTES], const char *mirror, const char *name,
		      const uint8_t *p, size_t clen, char *buf, size_t buflen)
{
	int l = 0, l2 = 0;
	km_err rc = KM_ERR_DECODE;
	EVP_CIPHER_CTX *ctx;
	uint8_t tag[KM_STATE_TAG_BYTES];

	if (clen + 1 > buflen)
		return KM_ERR_TOO_LARGE;
	memcpy(tag, p + KM_STATE_NONCE_BYTES + clen, KM_STATE_TAG_BYTES);
	ctx = EVP_CIPHER_CTX_new();
	if (!ctx)
		return KM_ERR_NOMEM;
	if (EVP_DecryptInit_ex(ctx, EVP_aes_256_gcm(), NULL, NULL, NULL) == 1 &&
	    EVP_CIPHER_CTX_ctrl(ctx, EVP_CTRL_GCM_SET_IVLEN, KM_STATE_NONCE_BYTES, NULL) == 1 &&
	    EVP_DecryptInit_ex(ctx, NULL, NULL, key, p) == 1 &&
	    (mirror ? aad_v1(ctx, false, mirror, name)
		    : EVP_DecryptUpdate(ctx, NULL, &l, (const uint8_t *)name, (int)strlen(name)) == 1) &&
	    EVP_DecryptUpdate(ctx, (uint8_t *)buf, &l, p + KM_STATE_NONCE_BYTES, (int)clen) == 1 &&
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

km_err km_state_open(const uint8_t key[KM_STATE_KEY_BYTES], const char *mirror, const char *name,
		     const uint8_t *sealed, size_t len, char *buf, size_t buflen, bool *legacy)
{
	const size_t frame0 = KM_STATE_NONCE_BYTES + KM_STATE_TAG_BYTES;
	km_err rc = KM_ERR_DECODE, rc0;
	bool tried = false;

	if (legacy)
		*legacy = false;
	if (len >= KM_STATE_SEAL_OVERHEAD && sealed[0] == KM_STATE_SEAL_V1) {
		rc = open_as(key, mirror, name, sealed + 1, len - KM_STATE_SEAL_OVERHEAD, buf, buflen);
		tried = true;
	}
	if (rc == KM_OK || rc == KM_ERR_NOMEM)
		return rc;
	/*
	 * Format 0 has no version byte: its nonce starts where format 1's version is, and is random, so
	 * a value of format 0 may begin with 1 too. What fails as format 1 is tried as format 0, whose
	 * tag cannot verify a value of format 1 (other nonce, other associated data).
	 */
	if (len < frame0)
		return KM_ERR_DECODE;
	rc0 = open_as(key, NULL, name, sealed, len - frame0, buf, buflen);
	if (rc0 == KM_OK && legacy)
		*legacy = true;
	/* Format 0's text is a byte longer: a buffer one short of it says nothing against format 1's answer. */
	return rc0 == KM_ERR_TOO_LARGE && tried ? rc : rc0;
}

km_err km_state_reseal(const uint8_t key[KM_STATE_KEY_BYTES], const char *mirror, const char *name,
		       const uint8_t *sealed, size_t len, uint8_t **out, size_t *outlen)
{
	size_t cap = len + 1;
	char *clear = malloc(cap);
	bool legacy = false;
	km_err rc;

	*out = NULL;
	*outlen = 0;
	if (!clear)
		return KM_ERR_NOMEM;
	rc = km_state_open(key, mirror, name, sealed, len, clear, cap, &legacy);
	if (rc == KM_OK && legacy)
		rc = km_state_seal(key, mirror, name, clear, out, outlen);
	OPENSSL_cleanse(clear, cap);
	free(clear);
	return rc;
}
